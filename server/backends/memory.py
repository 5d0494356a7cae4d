"""Single-process backend: the default when COWRITE_REDIS_URL is unset.

Appends never await, so seq assignment and delivery to listeners are atomic
with respect to the event loop: a listener sees events in seq order with no
gap. The epoch is drawn per document log when it is created, so a restarted
process tells resuming clients `epoch_changed`.
"""

import asyncio
import time
import uuid
from collections import defaultdict, deque
from collections.abc import AsyncIterator
from typing import Any

import orjson

from server.backends.base import (
    EventListener,
    LoggedEvent,
    LogHead,
    ResumeFailure,
    UnloggableEvent,
)

HISTORY_MAX_ENTRIES = 2000
RUN_RECORDS_MAX = 1000


class _DocumentLog:
    __slots__ = ("epoch", "events", "last_seq")

    def __init__(self, max_events: int) -> None:
        self.epoch = uuid.uuid4().hex
        self.events: deque[LoggedEvent] = deque(maxlen=max_events)
        self.last_seq = 0


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class MemoryBackend:
    remote = False

    def __init__(self, log_max_events: int = 10_000) -> None:
        self._log_max_events = log_max_events
        self._logs: dict[str, _DocumentLog] = {}
        self._listeners: dict[str, list[EventListener]] = defaultdict(list)
        self._history: dict[str, deque[dict[str, Any]]] = {}
        self._runs: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
        self._claims: dict[str, float] = {}
        self._connections: dict[str, int] = defaultdict(int)
        self._run_starts: dict[str, deque[float]] = defaultdict(deque)
        self._active: dict[str, dict[str, Any]] = {}
        self._presence: dict[str, set[str]] = defaultdict(set)
        self._inboxes: dict[str, asyncio.Queue[dict[str, Any]]] = defaultdict(asyncio.Queue)

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def ready(self) -> bool:
        return True

    def _log(self, document_id: str) -> _DocumentLog:
        log = self._logs.get(document_id)
        if log is None:
            log = self._logs[document_id] = _DocumentLog(self._log_max_events)
        return log

    async def append(self, document_id: str, event: dict[str, Any]) -> LoggedEvent:
        log = self._log(document_id)
        seq = log.last_seq + 1
        try:  # serialize before the number is taken: a refusal leaves no gap
            frame = orjson.dumps({**event, "seq": seq, "ts": now_ms()}).decode()
        except (TypeError, ValueError) as exc:
            raise UnloggableEvent(f"event cannot be serialized: {exc}") from exc
        log.last_seq = seq
        logged = LoggedEvent(seq, str(event["type"]), frame)
        log.events.append(logged)
        for listener in tuple(self._listeners.get(document_id, ())):
            listener(logged)
        return logged

    async def head(self, document_id: str) -> LogHead:
        log = self._log(document_id)
        return LogHead(log.epoch, log.last_seq)

    async def read_after(
        self, document_id: str, epoch: str, after_seq: int, until_seq: int | None = None
    ) -> list[LoggedEvent] | ResumeFailure:
        log = self._log(document_id)
        if epoch != log.epoch:
            return "epoch_changed"
        last = log.last_seq if until_seq is None else min(until_seq, log.last_seq)
        if after_seq > log.last_seq:
            return "history_truncated"
        if after_seq >= last:
            return []
        oldest = log.events[0].seq if log.events else log.last_seq + 1
        if oldest > after_seq + 1:
            return "history_truncated"
        start = after_seq + 1 - oldest
        return [log.events[i] for i in range(start, start + (last - after_seq))]

    async def subscribe(self, document_id: str, listener: EventListener) -> None:
        self._listeners[document_id].append(listener)

    def unsubscribe(self, document_id: str, listener: EventListener) -> None:
        listeners = self._listeners.get(document_id)
        if listeners and listener in listeners:
            listeners.remove(listener)
            if not listeners:
                del self._listeners[document_id]

    async def append_history(self, document_id: str, entries: list[dict[str, Any]]) -> None:
        history = self._history.get(document_id)
        if history is None:
            history = self._history[document_id] = deque(maxlen=HISTORY_MAX_ENTRIES)
        history.extend(entries)

    async def read_history(self, document_id: str) -> list[dict[str, Any]]:
        return list(self._history.get(document_id, ()))

    async def put_run_record(self, document_id: str, run_id: str, record: dict[str, Any]) -> None:
        runs = self._runs[document_id]
        runs[run_id] = record
        while len(runs) > RUN_RECORDS_MAX:
            del runs[next(iter(runs))]

    async def get_run_record(self, document_id: str, run_id: str) -> dict[str, Any] | None:
        return self._runs.get(document_id, {}).get(run_id)

    async def claim_once(self, key: str, ttl_s: float) -> bool:
        now = time.monotonic()
        if len(self._claims) > 10_000:
            self._claims = {k: exp for k, exp in self._claims.items() if exp > now}
        expires = self._claims.get(key)
        if expires is not None and expires > now:
            return False
        self._claims[key] = now + ttl_s
        return True

    async def acquire_connection(self, user_id: str, connection_id: str, limit: int) -> bool:
        if limit and self._connections[user_id] >= limit:
            return False
        self._connections[user_id] += 1
        return True

    async def release_connection(self, user_id: str, connection_id: str) -> None:
        count = self._connections.get(user_id, 0) - 1
        if count > 0:
            self._connections[user_id] = count
        else:
            self._connections.pop(user_id, None)

    async def take_run_slot(self, user_id: str, per_minute: int) -> int:
        if not per_minute:
            return 0
        now = time.monotonic()
        starts = self._run_starts[user_id]
        while starts and starts[0] <= now - 60.0:
            starts.popleft()
        if len(starts) >= per_minute:
            return max(1, int((starts[0] + 60.0 - now) * 1000))
        starts.append(now)
        return 0

    # One process: the active run is always this process's own, nothing expires.
    async def claim_run(self, document_id: str, record: dict[str, Any], lease_s: float
                        ) -> dict[str, Any] | None:
        active = self._active.get(document_id)
        if active is not None:
            return active
        self._active[document_id] = record
        return None

    async def renew_run(self, document_id: str, record: dict[str, Any], lease_s: float) -> bool:
        active = self._active.get(document_id)
        if active is None or active["run_id"] != record["run_id"]:
            return False
        self._active[document_id] = record
        return True

    async def release_run(self, document_id: str, run_id: str) -> None:
        active = self._active.get(document_id)
        if active is not None and active["run_id"] == run_id:
            del self._active[document_id]

    async def active_run(self, document_id: str) -> dict[str, Any] | None:
        return self._active.get(document_id)

    async def expired_runs(self) -> list[tuple[str, dict[str, Any]]]:
        return []

    async def send(self, instance_id: str, message: dict[str, Any]) -> None:
        self._inboxes[instance_id].put_nowait(message)

    async def inbox(self, instance_id: str) -> AsyncIterator[dict[str, Any]]:
        queue = self._inboxes[instance_id]
        while True:
            yield await queue.get()

    async def set_presence(self, document_id: str, member: str, present: bool) -> None:
        if present:
            self._presence[document_id].add(member)
        else:
            self._presence[document_id].discard(member)

    async def is_present(self, document_id: str, user_id: str, client_id: str) -> bool:
        prefix = f"{user_id}|{client_id}|"
        return any(m.startswith(prefix) for m in self._presence.get(document_id, ()))
