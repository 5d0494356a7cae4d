"""The per-connection writer: one task, one bounded queue, seq bookkeeping.

Durable events reach a connection through `push_event` (from the backend's
fan-out) and are sent in seq order exactly once: anything at or below the
last sent seq is dropped, and a gap is filled from the document log before the
event that revealed it. That makes the resume seam and cross-instance
delivery safe without locks.

The queue is bounded: a client that stops reading is closed with 4009 once
`max_events` durable events wait for it. Nothing is lost: the log still
holds them and the client resumes. After each batch the writer yields, so one
connection's burst never starves the others.
"""

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from server.backends.base import LoggedEvent

BATCH = 64


@dataclass(frozen=True, slots=True)
class CloseRequest:
    code: int
    reason: str


@dataclass(frozen=True, slots=True)
class _Frame:
    type: str
    text: str


@dataclass(frozen=True, slots=True)
class _Replay:
    events: list[LoggedEvent]


_Item = _Frame | LoggedEvent | _Replay | CloseRequest
Backfill = Callable[[int, int], Awaitable[list[LoggedEvent] | None]]


class Outbound:
    def __init__(
        self,
        send: Callable[[str], Awaitable[None]],
        *,
        max_events: int,
        backfill: Backfill,
        on_sent: Callable[[str], None] = lambda _type: None,
        on_idle: Callable[[], None] = lambda: None,
    ) -> None:
        self._send = send
        self._max_events = max_events
        self._backfill = backfill
        self._on_sent = on_sent
        self._on_idle = on_idle
        self._queue: deque[_Item] = deque()
        self._held: list[LoggedEvent] | None = []  # live events that arrive before `begin`
        self._queued_events = 0
        self._wake = asyncio.Event()
        self._busy = False
        self.sent_seq = 0
        self.close_request: CloseRequest | None = None

    @property
    def has_pending_send(self) -> bool:
        return self._busy or bool(self._queue)

    def begin(self, welcome: _Frame | None, start_seq: int, replay: list[LoggedEvent]) -> None:
        """Queue the welcome, then the replay, then live events seen meanwhile."""
        self.sent_seq = start_seq
        if welcome is not None:
            self._queue.append(welcome)
        if replay:
            self._queue.append(_Replay(replay))
        held, self._held = self._held or [], None
        for event in held:
            self.push_event(event)
        self._wake.set()

    def push_frame(self, type_: str, text: str) -> None:
        if self.close_request is None:
            self._queue.append(_Frame(type_, text))
            self._wake.set()

    def push_event(self, event: LoggedEvent) -> None:
        if self.close_request is not None:
            return
        if self._held is not None:
            self._held.append(event)
            return
        if self._queued_events >= self._max_events:
            self.close(CloseRequest(4009, "slow consumer: resume to catch up"), drop_pending=True)
            return
        self._queued_events += 1
        self._queue.append(event)
        self._wake.set()

    def close(self, request: CloseRequest, *, drop_pending: bool = False) -> None:
        """Send what is queued (unless `drop_pending`), then close."""
        if self.close_request is not None:
            return
        self.close_request = request
        if drop_pending:
            self._queue.clear()
            self._queued_events = 0
        self._queue.append(request)
        self._wake.set()

    async def run(self) -> CloseRequest:
        """Send until a close is requested; return it for the endpoint to perform."""
        while True:
            while not self._queue:
                self._busy = False
                self._on_idle()
                if self._queue:
                    break
                self._wake.clear()
                await self._wake.wait()
            self._busy = True
            for _ in range(min(BATCH, len(self._queue))):
                item = self._queue.popleft()
                if isinstance(item, CloseRequest):
                    return item
                if isinstance(item, _Frame):
                    await self._send(item.text)
                    self._on_sent(item.type)
                elif isinstance(item, LoggedEvent):
                    self._queued_events -= 1
                    if not await self._send_event(item):
                        return self._lost_track()
                else:
                    for event in item.events:
                        if not await self._send_event(event):
                            return self._lost_track()
            if self._queue:
                await asyncio.sleep(0)  # more to send: let other connections' writers run

    def _lost_track(self) -> CloseRequest:
        """The log no longer holds events this connection missed: make it resume."""
        self.close_request = CloseRequest(1011, "missed events are no longer in the log; resume")
        return self.close_request

    async def _send_event(self, event: LoggedEvent) -> bool:
        if event.seq <= self.sent_seq:
            return True
        if event.seq > self.sent_seq + 1:
            missing = await self._backfill(self.sent_seq, event.seq - 1)
            if missing is None:
                return False
            for earlier in missing:
                if earlier.seq == self.sent_seq + 1:
                    await self._send(earlier.frame)
                    self.sent_seq = earlier.seq
                    self._on_sent(earlier.type)
            if self.sent_seq != event.seq - 1:
                return False
        await self._send(event.frame)
        self.sent_seq = event.seq
        self._on_sent(event.type)
        return True
