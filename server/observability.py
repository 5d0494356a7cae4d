"""Structured logs and Prometheus metrics.

Log lines carry `document_id`, `user_id` and `connection_id` through
`extra=` so they can be filtered; tokens are never passed to a logger.
Metrics live in a registry per app, so several apps (tests, two instances in
one process) never collide.
"""

import logging
import sys
import time
from collections.abc import Callable
from typing import Any

import orjson
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LOG_CONTEXT_FIELDS = ("document_id", "user_id", "connection_id", "run_id", "instance_id")
logger = logging.getLogger("cowrite")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for field in LOG_CONTEXT_FIELDS:
            value = getattr(record, field, None)
            if value is not None:
                entry[field] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(entry).decode()


_CONTROL = {code: f"\\x{code:02x}" for code in [*range(0x20), *range(0x7F, 0xA0)]}
_CONTROL.update({ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t",
                 0x2028: "\\u2028", 0x2029: "\\u2029"})


def escape_controls(text: str) -> str:
    """Control characters as visible escapes: a client string (a client id, a
    message type, an origin) can never start a forged line in a text log."""
    return text.translate(_CONTROL)


class TextFormatter(logging.Formatter):
    """One line per record (plus our own tracebacks); every client-supplied
    string is escaped, so one record is always one line."""

    def format(self, record: logging.LogRecord) -> str:
        context = " ".join(
            f"{field}={escape_controls(str(getattr(record, field)))}"
            for field in LOG_CONTEXT_FIELDS
            if getattr(record, field, None) is not None
        )
        message = escape_controls(record.getMessage())
        line = f"{time.strftime('%H:%M:%S')} {record.levelname:<7} {message}"
        if context:
            line += f"  [{context}]"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def configure_logging(json_lines: bool, level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if json_lines else TextFormatter())
    logger.handlers[:] = [handler]
    logger.setLevel(level.upper())
    logger.propagate = False


class _Tally:
    """Per-label counts kept as plain ints and added to their `Counter`'s children
    when the registry is collected (a scrape): `Counter.inc` takes a lock and
    walks two objects, and a busy connection counts every frame it sends and
    receives. A label's child is still created at its first count, so the
    exposition (its `_created` time included) is what counting at once gives;
    scrapes run on the event loop's thread, like the counting."""

    def __init__(self, counter: Counter) -> None:
        self._counter = counter
        self.counts: dict[str, int] = {}
        self._children: dict[str, Any] = {}

    def add(self, label: str) -> None:
        """`counter{label}` += 1, as a plain int until the next scrape."""
        try:
            self.counts[label] += 1
        except KeyError:
            self._children[label] = self._counter.labels(label)
            self.counts[label] = 1

    def fold(self) -> None:
        counts = self.counts
        for label, count in counts.items():
            if count:
                self._children[label].inc(count)
                counts[label] = 0


class _FoldTallies:
    """A collector with no metrics of its own, registered before the counters:
    collecting it folds the tallies into them first."""

    def __init__(self, tallies: list[_Tally]) -> None:
        self._tallies = tallies

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> list[Any]:
        for tally in self._tallies:
            tally.fold()
        return []


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        tallies: list[_Tally] = []
        self.registry.register(_FoldTallies(tallies))
        self.connections_open = Gauge(
            "cowrite_connections_open", "Open WebSocket connections", registry=self.registry
        )
        self.messages_in = Counter(
            "cowrite_messages_in", "Client messages received, by type",
            ["type"], registry=self.registry,
        )
        self.messages_out = Counter(
            "cowrite_messages_out", "Server events sent, by type", ["type"], registry=self.registry
        )
        self.errors = Counter(
            "cowrite_errors", "Error events sent, by code", ["code"], registry=self.registry
        )
        self.closes = Counter(
            "cowrite_closes", "Connections closed by the server, by close code",
            ["code"], registry=self.registry,
        )
        self.handshakes_refused = Counter(
            "cowrite_handshakes_refused", "Sockets closed before hello to make room (the cap)",
            registry=self.registry,
        )
        self.runs = Counter(
            "cowrite_runs_finished", "Runs finished, by status", ["status"], registry=self.registry
        )
        self._sent = _Tally(self.messages_out)
        self._received = _Tally(self.messages_in)
        tallies += (self._sent, self._received)
        self.abort_latency = Histogram(
            "cowrite_abort_seconds", "editor.change received -> run.finished logged",
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5),
            registry=self.registry,
        )

    def watch_memory_documents(self, count: Callable[[], int]) -> None:
        """`cowrite_memory_documents`: documents the memory backend holds (eviction)."""
        Gauge("cowrite_memory_documents", "Documents held by the memory backend",
              registry=self.registry).set_function(count)

    def count_received(self, message_type: str) -> None:
        """`messages_in{type}` += 1 (`_Tally`)."""
        self._received.add(message_type)

    def count_sent(self, event_type: str) -> None:
        """`messages_out{type}` += 1 (`_Tally`)."""
        self._sent.add(event_type)
