"""Single-process backend: the default when COWRITE_REDIS_URL is unset.

Appends never await, so seq assignment and delivery to listeners are atomic
with respect to the event loop: a listener sees events in seq order with no
gap. An event is serialized before it takes a seq, so one that cannot be
encoded (`UnloggableEvent`) leaves no trace. The epoch is drawn per document
log when it is created, so a restarted process, or a document evicted while
idle, tells resuming clients `epoch_changed`.

Eviction (`COWRITE_MEMORY_IDLE_S`, `COWRITE_MEMORY_MAX_DOCUMENTS`): every operation on
a document marks it used. A document is *in use* while some connection of this process
is subscribed to it or it has an active run; an in-use document is never evicted. Two
rules free the rest, log, history and run records together:
- idle: a document not used for `idle_s` seconds is evicted by a sweep that
  runs every `idle_s / 4` seconds (at most every 30 s);
- count: when more than `max_documents` documents are held, the least
  recently used ones that are not in use are evicted at once, idle or not,
  so memory stays bounded under a flood of new documents. 0 disables a rule."""

import asyncio
import bisect
import contextlib
import ctypes
import ctypes.util
import logging
import time
import uuid
from collections import OrderedDict, defaultdict, deque
from collections.abc import Callable, Sequence
from itertools import islice
from operator import itemgetter
from typing import Any

from server.backends.base import (
    RUN_RECORDS_MAX,
    EventListener,
    LoggedEvent,
    LogHead,
    LogReset,
    ResumeFailure,
    RunParts,
    encode_event_body,
)
from server.backends.memory_history import HISTORY_MAX_ENTRIES as HISTORY_MAX_ENTRIES
from server.backends.memory_history import ThreadedHistory
from server.backends.memory_instances import MemoryInstances

logger = logging.getLogger("cowrite.memory")
SWEEP_MAX_INTERVAL_S = 30.0
TRIM_AFTER_EVICTIONS = 256

_Entry = tuple[int, str, str]  # seq, type, frame


class _DocumentLog:
    """One document's events, kept as plain (seq, type, frame) tuples: the garbage
    collector stops tracking a tuple of numbers and strings after its first pass, so a
    log of thousands of events adds nothing to the full collections that would otherwise
    walk every one of them (a `LoggedEvent` is built again for a replay)."""

    __slots__ = ("epoch", "events", "last_seq")

    def __init__(self, max_events: int) -> None:
        self.epoch = uuid.uuid4().hex
        self.events: deque[_Entry] = deque(maxlen=max_events)
        self.last_seq = 0


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def _malloc_trim() -> Callable[[], None]:
    """glibc's `malloc_trim(0)` (a no-op elsewhere): RSS really falls after evictions."""
    name = ctypes.util.find_library("c")
    libc = None
    if name:
        with contextlib.suppress(OSError):
            libc = ctypes.CDLL(name)
    trim = getattr(libc, "malloc_trim", None)

    def run() -> None:
        if trim is not None:
            trim(0)

    return run


class MemoryBackend(MemoryInstances):
    remote = False

    def __init__(self, log_max_events: int = 10_000, *, idle_s: float = 3600.0,
                 max_documents: int = 10_000, clock: Callable[[], float] = time.monotonic,
                 history_max_entries: int = HISTORY_MAX_ENTRIES) -> None:
        super().__init__()
        self._log_max_events = log_max_events
        self._idle_s = idle_s
        self._max_documents = max_documents
        self._clock = clock
        self._used: OrderedDict[str, float] = OrderedDict()  # least recently used first
        self._sweeper: asyncio.Task[None] | None = None
        self._trim = _malloc_trim()
        self._evicted_since_trim = 0
        self.evictions = 0
        self._logs: dict[str, _DocumentLog] = {}
        self._listeners: dict[str, list[EventListener]] = defaultdict(list)
        self._history: defaultdict[str, ThreadedHistory] = defaultdict(
            lambda: ThreadedHistory(history_max_entries))  # fair across threads
        self._runs: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
        self._claims: dict[str, float] = {}
        self._connections: dict[str, int] = defaultdict(int)
        self._run_starts: dict[str, deque[float]] = defaultdict(deque)
        self._active: dict[str, dict[str, Any]] = {}
        self._run_parts: dict[str, list[str]] = {}  # the active run's checkpoint parts
        self._queues: dict[str, list[dict[str, Any]]] = {}
        self._presence: dict[str, set[str]] = defaultdict(set)

    async def start(self) -> None:
        if self._idle_s > 0 and self._sweeper is None:
            self._sweeper = asyncio.create_task(self._sweep_loop())

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None

    # -- eviction ---------------------------------------------------------------
    @property
    def document_count(self) -> int:
        return len(self._used)

    def _touch(self, document_id: str) -> None:
        used = self._used
        if document_id in used:
            used.move_to_end(document_id)
            used[document_id] = self._clock()
            return
        used[document_id] = self._clock()
        if self._max_documents and len(used) > self._max_documents:
            self.evict(protect=document_id)

    def in_use(self, document_id: str) -> bool:
        """Subscribed connections or an active run keep a document."""
        return bool(self._listeners.get(document_id)) or document_id in self._active \
            or document_id in self._queues

    def evict(self, protect: str | None = None) -> int:
        """Apply both eviction rules now; return how many documents went.
        `protect`: the document being used right now (the newest), kept."""
        now, used, evicted = self._clock(), self._used, 0
        skipped: list[str] = []
        while used:
            document_id, last = next(iter(used.items()))
            if document_id == protect:
                break
            over = bool(self._max_documents) and len(used) + len(skipped) > self._max_documents
            idle = self._idle_s > 0 and now - last >= self._idle_s
            if not (over or idle):
                break
            del used[document_id]
            if self.in_use(document_id):
                skipped.append(document_id)
                continue
            self._forget(document_id)
            evicted += 1
        for document_id in skipped:  # still in use: as good as used now
            used[document_id] = now
        if evicted:
            self.evictions += evicted
            self._evicted_since_trim += evicted
            if self._evicted_since_trim >= TRIM_AFTER_EVICTIONS:
                self.trim()
        return evicted

    def trim(self) -> None:
        """Give freed heap pages back to the OS (glibc keeps them otherwise)."""
        self._evicted_since_trim = 0
        self._trim()

    def _forget(self, document_id: str) -> None:
        self._logs.pop(document_id, None)
        self._history.pop(document_id, None)
        self._runs.pop(document_id, None)
        self._presence.pop(document_id, None)

    async def _sweep_loop(self) -> None:
        interval = min(SWEEP_MAX_INTERVAL_S, self._idle_s / 4)
        while True:
            await asyncio.sleep(interval)
            evicted = self.evict()
            if evicted:
                self.trim()  # at most once per sweep: a few ms at most
                logger.info("evicted %d idle documents (%d kept)", evicted, len(self._used))

    async def ready(self) -> bool:
        return True

    def _log(self, document_id: str) -> _DocumentLog:
        self._touch(document_id)
        log = self._logs.get(document_id)
        if log is None:
            log = self._logs[document_id] = _DocumentLog(self._log_max_events)
        return log

    async def append(self, document_id: str, event: dict[str, Any], write_id: str = ""
                     ) -> LoggedEvent:
        body = encode_event_body(event)  # may raise UnloggableEvent: no seq is taken
        return self.append_encoded(document_id, str(event["type"]), body)
    append_once = append  # no reply to lose: the write id is not needed

    async def append_fenced(self, document_id: str, event: dict[str, Any], _: str) -> None:
        await self.append(document_id, event)  # no other instance to take the run over

    def append_encoded(self, document_id: str, kind: str, body: bytes) -> LoggedEvent:
        """`append` of an event already encoded (`encode_event_body`), as a plain call:
        it never waits, so a session logs an event without a coroutine per append."""
        log = self._log(document_id)
        seq = log.last_seq + 1
        frame = body.decode() + f',"seq":{seq},"ts":{now_ms()}}}'
        logged = LoggedEvent(seq, kind, frame)
        log.last_seq = seq
        log.events.append((seq, kind, frame))
        for listener in tuple(self._listeners.get(document_id, ())):
            listener(logged)
        return logged

    async def head(self, document_id: str) -> LogHead:
        log = self._log(document_id)
        return LogHead(log.epoch, log.last_seq)

    async def read_after(self, document_id: str, epoch: str, after_seq: int,
                         until_seq: int | None = None) -> list[LoggedEvent] | ResumeFailure:
        """Found by seq (bisect over the seq-ordered log), never by position."""
        log = self._log(document_id)
        if epoch != log.epoch:
            return "epoch_changed"
        if after_seq > log.last_seq:
            return "history_truncated"
        last = log.last_seq if until_seq is None else min(until_seq, log.last_seq)
        if after_seq >= last:
            return []
        events = log.events
        start = bisect.bisect_right(events, after_seq, key=itemgetter(0))
        stop = bisect.bisect_right(events, last, key=itemgetter(0))
        found = [LoggedEvent(*entry) for entry in islice(events, start, stop)]
        if not found or found[0].seq != after_seq + 1 or found[-1].seq != last or \
                len(found) != last - after_seq:
            return "history_truncated"
        return found

    async def subscribe(self, document_id: str, listener: EventListener,
                        on_reset: LogReset | None = None) -> None:
        """`on_reset` is never called: this log lives as long as the process."""
        self._touch(document_id)
        self._listeners[document_id].append(listener)

    def unsubscribe(self, document_id: str, listener: EventListener) -> None:
        self._touch(document_id)
        listeners = self._listeners.get(document_id)
        if listeners and listener in listeners:
            listeners.remove(listener)
            if not listeners:
                del self._listeners[document_id]

    async def append_history(self, document_id: str, entries: list[dict[str, Any]]) -> None:
        self._touch(document_id)
        self._history[document_id].extend(entries)

    async def read_history(self, document_id: str) -> list[dict[str, Any]]:
        return history.entries() if (history := self._history.get(document_id)) else []

    async def put_run_record(self, document_id: str, run_id: str, record: dict[str, Any]) -> None:
        self._touch(document_id)
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
        self._touch(document_id)
        active = self._active.get(document_id)
        if active is not None:
            return active
        self._active[document_id] = record
        return None

    async def renew_run(self, document_id: str, record: dict[str, Any], lease_s: float,
                        parts: RunParts | None = None) -> bool:
        active = self._active.get(document_id)
        if active is None or active["run_id"] != record["run_id"]:
            return False
        self._active[document_id] = record
        if parts is not None:
            kept = [] if parts.reset else self._run_parts.get(document_id, [])
            self._run_parts[document_id] = [*kept, *parts.entries]
        return True

    async def renew_and_append(self, document_id: str, record: dict[str, Any], lease_s: float,
                               parts: RunParts | None, events: Sequence[dict[str, Any]]
                               ) -> bool:
        encoded = [(str(event["type"]), encode_event_body(event)) for event in events]
        renewed = await self.renew_run(document_id, record, lease_s, parts)
        for kind, body in encoded if renewed else ():  # no await since: one step
            self.append_encoded(document_id, kind, body)
        return renewed

    async def run_parts(self, document_id: str) -> list[str]:
        return list(self._run_parts.get(document_id, ()))

    async def release_run(self, document_id: str, run_id: str, owner: str) -> None:
        active = self._active.get(document_id)
        if active is not None and active["run_id"] == run_id \
                and active.get("owner", owner) == owner:
            del self._active[document_id]
            self._run_parts.pop(document_id, None)
            self._touch(document_id)  # idle from now on, not from the run's start

    # -- the run queue (section 12) ------------------------------------------------
    async def enqueue_run(self, document_id: str, entry: dict[str, Any], limit: int
                          ) -> int | None:
        queue = self._queues.setdefault(document_id, [])
        if limit and len(queue) >= limit:
            return None
        queue.append(entry)
        return len(queue)

    async def queued_runs(self, document_id: str) -> list[dict[str, Any]]:
        return list(self._queues.get(document_id, ()))

    async def remove_queued(self, document_id: str, run_id: str) -> dict[str, Any] | None:
        queue = self._queues.get(document_id, [])
        for index, entry in enumerate(queue):
            if entry.get("run_id") == run_id:
                del queue[index]
                if not queue:
                    del self._queues[document_id]
                return entry
        return None

    async def active_run(self, document_id: str) -> dict[str, Any] | None:
        return self._active.get(document_id)

    async def set_presence(self, document_id: str, member: str, present: bool) -> None:
        if present:
            self._touch(document_id)
            self._presence[document_id].add(member)
        else:
            members = self._presence.get(document_id)
            if members is not None:
                members.discard(member)
                if not members:
                    del self._presence[document_id]

    async def is_present(self, document_id: str, user_id: str, client_id: str) -> bool:
        prefix = f"{user_id}|{client_id}|"
        return any(m.startswith(prefix) for m in self._presence.get(document_id, ()))
