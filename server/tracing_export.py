"""Where `server.tracing`'s ended spans go: records made into `ReadableSpan`s, and the
exporting thread used when cowrite builds the tracer provider itself.

A span ends as a record, a plain tuple of strings and ints (`Record`): CPython's
collector stops tracking such tuples (and dicts of strings and ints) the first time
they survive a collection, so records waiting for export never count towards a full
collection. Made into SDK objects as soon as they ended and queued in the SDK's
`BatchSpanProcessor` (up to 512 spans or 5 s), every span left two tracked objects
in the oldest generation, and the full collections they brought on (~0.1 s each on
a loaded server) cost as much CPU as the spans themselves.

`SpanBatcher` is that processor's policy (export 512 at a time, at least every 5 s,
at most 2,048 waiting, the rest dropped and counted; the same `OTEL_BSP_*` variables
change them) with the conversion moved into its thread, right before the export:
the `ReadableSpan`s live only for the export.
Nothing here imports OpenTelemetry until tracing is switched on.
"""

from __future__ import annotations

import atexit
import collections
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.sdk.trace.id_generator import IdGenerator
    from opentelemetry.trace import SpanContext, TraceState

logger = logging.getLogger("cowrite.tracing")

# An ended span: (name, start ns, end ns, attributes, trace id, span id (0: make one),
# parent span id (0: a root), sampled, error description (None: status unset), trace
# state (None: the default)).
Record = tuple[str, int, int, dict[str, Any], int, int, int, bool, str | None,
               "TraceState | None"]
# BatchSpanProcessor's knobs, read from the same variables with the same defaults.
LIMITS = (("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512), ("OTEL_BSP_MAX_QUEUE_SIZE", 2048),
          ("OTEL_BSP_SCHEDULE_DELAY", 5000))
CHUNK = 64  # records converted between two chances for the event loop to take the GIL
SHUTDOWN_WAIT_S = 2.0  # how long shutdown (SIGTERM) waits for the last exports


class Converter:
    """Records -> `ReadableSpan`s of the provider's resource, scope `cowrite`, span ids
    from the provider's id generator (made here: nothing refers to a child's id)."""

    def __init__(self, resource: Resource, ids: IdGenerator) -> None:
        from opentelemetry.sdk.trace import ReadableSpan
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope
        from opentelemetry.trace import (
            DEFAULT_TRACE_STATE,
            SpanContext,
            SpanKind,
            Status,
            StatusCode,
            TraceFlags,
        )

        self._readable, self._context, self._status = ReadableSpan, SpanContext, Status
        self._resource, self._span_id = resource, ids.generate_span_id
        self._scope, self._kind = InstrumentationScope("cowrite"), SpanKind.INTERNAL
        self._unset, self._error = Status(StatusCode.UNSET), StatusCode.ERROR
        self._flags = {True: TraceFlags(TraceFlags.SAMPLED), False: TraceFlags(TraceFlags.DEFAULT)}
        self._default_state = DEFAULT_TRACE_STATE

    def __call__(self, records: Sequence[Record]) -> list[ReadableSpan]:
        """In `ReadableSpan.__init__`'s argument order, by position; a run's context is
        made once per call for all its children in it."""
        readable, context_of, resource, kind, scope = (
            self._readable, self._context, self._resource, self._kind, self._scope)
        parents: dict[int, SpanContext] = {}
        spans = []
        for (name, start, end, attributes, trace_id, span_id, parent_id, sampled, error,
             state) in records:
            flags, state = self._flags[sampled], state or self._default_state
            parent = None
            if parent_id:
                parent = parents.get(parent_id)
                if parent is None:
                    parent = parents[parent_id] = context_of(trace_id, parent_id, False, flags,
                                                             state)
            context = context_of(trace_id, span_id or self._span_id(), False, flags, state)
            status = self._unset if error is None else self._status(self._error, error)
            spans.append(readable(name, context, parent, resource, attributes, (), (), kind,
                                  None, status, start, end, scope))
        return spans


class SpanBatcher:
    """Exports records from a thread of its own, 512 at a time and at least every 5 s;
    `add` (the event loop's side) only appends to a deque and, at 512 waiting, wakes
    the thread. Shut down at exit (what is waiting is exported first, for at most
    `SHUTDOWN_WAIT_S`)."""

    def __init__(self, exporter: SpanExporter, convert: Callable[[Sequence[Record]],
                                                                 list[ReadableSpan]]) -> None:
        self._exporter, self._convert = exporter, convert
        self._batch, self._max_queue, delay_ms = (_positive(name, default)
                                                  for name, default in LIMITS)
        self._delay_s = delay_ms / 1000
        self._queue: collections.deque[Record] = collections.deque()
        self._wake = threading.Event()
        self._stopping = False
        self._abandoned = False  # shutdown gave up waiting for the exporter
        self._exporting = 0  # sampled records of the batch being exported
        self.dropped = 0
        self._thread = threading.Thread(target=self._work, name="cowrite-otel-export",
                                        daemon=True)
        self._thread.start()
        atexit.register(self.shutdown)

    def add(self, records: list[Record]) -> None:
        queue = self._queue
        room = self._max_queue - len(queue)
        if len(records) > room:
            if not self.dropped:
                logger.warning("spans are ended faster than they are exported; dropping")
            self.dropped += len(records) - max(room, 0)
            records = records[:max(room, 0)]
        queue.extend(records)
        if len(queue) >= self._batch and not self._wake.is_set():
            self._wake.set()

    def _work(self) -> None:
        queue = self._queue
        while True:
            self._wake.wait(self._delay_s)
            self._wake.clear()  # before draining: a wake-up during the drain is not lost
            stopping = self._stopping
            while queue and not self._abandoned:
                batch = [queue.popleft() for _ in range(min(self._batch, len(queue)))]
                sampled = [record for record in batch if record[7]]
                self._exporting = len(sampled)
                try:
                    if sampled:
                        self._exporter.export(self._converted(sampled))
                except Exception:
                    logger.exception("exporting %d spans failed", len(sampled))
                self._exporting = 0
            if stopping or self._abandoned:
                return

    def _converted(self, records: list[Record]) -> list[ReadableSpan]:
        """Converted 64 at a time, letting the event loop's thread have the GIL between
        chunks: converting 512 at once would hold it for a millisecond or two."""
        spans: list[ReadableSpan] = []
        for at in range(0, len(records), CHUNK):
            if at:
                time.sleep(0)
            spans += self._convert(records[at:at + CHUNK])
        return spans

    def shutdown(self, timeout_s: float = SHUTDOWN_WAIT_S) -> None:
        """Export what is waiting, for at most `timeout_s`, then shut the exporter down
        (idempotent). An exporter that has not finished by then (its endpoint down or
        not answering: the OTLP exporter retries for up to 10 s per batch) is given up
        on: what it still holds is dropped, counted in one log line, and shutting it
        down ends its retries; the thread is a daemon, so the process does not wait for
        a request still in flight. A SIGTERM thus stops cowrite within seconds."""
        if self._stopping:
            return
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            self._abandoned = True  # the thread exports no further batch
            unsent = self._exporting + sum(1 for record in self._queue.copy() if record[7])
            logger.warning("tracing: the span exporter did not finish within %g s at "
                           "shutdown; %d spans were dropped", timeout_s, unsent)
        self._exporter.shutdown()
        atexit.unregister(self.shutdown)


def _positive(name: str, default: int) -> int:
    raw = os.environ.get(name, "")
    try:
        value = int(raw) if raw else default
    except ValueError:
        value = 0
    if value <= 0:
        logger.warning("%s=%r is not a positive integer; using %d", name, raw, default)
        return default
    return value


def dropping_exporter() -> SpanExporter:
    """`COWRITE_OTEL_EXPORTER=none`: an exporter that drops every span, behind the same
    batching and conversion the real exporters get, so the measured overhead is all
    but the export itself."""
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    class Dropping(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    return Dropping()


def exporter(kind: str) -> SpanExporter:
    """The exporter `COWRITE_OTEL_EXPORTER` names."""
    if kind == "none":
        return dropping_exporter()
    if kind == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[import-not-found, unused-ignore]
            OTLPSpanExporter,
        )
    except ImportError as exc:  # README: one line naming the variable, exit 2
        from server.startup_errors import StartupError

        raise StartupError(
            "COWRITE_OTEL_EXPORTER=otlp (the default) needs the OTLP exporter: pip install "
            "'cowrite[otel]' (or opentelemetry-exporter-otlp-proto-http), or set "
            "COWRITE_OTEL_EXPORTER=console or none") from exc
    otlp: SpanExporter = OTLPSpanExporter()
    return otlp
