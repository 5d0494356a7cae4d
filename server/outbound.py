"""The per-connection writer: one task, one bounded queue, seq bookkeeping.

Durable events reach a connection through `push_event` (from the backend's
fan-out) and are sent in seq order exactly once: anything at or below the
last sent seq is dropped, and a gap is filled from the document log before the
event that revealed it. That makes the resume seam and cross-instance
delivery safe without locks.

Bounds: a client that stops reading is closed with 4009 once `max_events`
frames, or `max_bytes` characters of frame text besides the largest waiting
frame, wait for it (JSON frames are mostly ASCII, so characters are bytes;
counting characters costs no encoding). The queue is dropped at once and a
send blocked on the peer is abandoned, so the memory goes back; nothing is lost, the log still holds
the events and the client resumes. A resume's replay is read from the log in
one piece and is not counted: counting it would close a client that resumes
after a long absence before it could catch up, again and again.

Backend outages: when filling a gap needs the log and the backend (Redis)
does not answer, the writer waits and retries with backoff instead of ending
the connection; only events that are gone from the log end it (1011).

Call tokens: a `tool.call` carries the single-use token of its client tool
call; only connections of the token's user (the run's user) see it. Other
connections get the frame without `token`, live and on replay alike, because
both go through `_send_event` (`server.redaction`).

After each batch the writer yields, so one connection's burst never starves
the others.

Inline sends (`inline=True`, the WebSocket endpoint's writers): while the
writer is idle (nothing queued, nothing being sent), an event or frame is
sent at once by whoever publishes it, instead of waking the writer task for
it. A WebSocket send with room in its buffer completes without waiting, so
this saves a task switch per frame and, under load, a whole loop iteration
(a first delta, an abort's `run.finished` reach the socket in the iteration
that produced them). A send that has to wait (the peer's buffer is full) is
handed to the writer, which finishes it before anything queued after it; a
send that fails is raised by the writer, in its own task, as if it had sent.
Everything else (order, seq bookkeeping, gap filling, the bounds) is the
writer's as before: only the next event in seq order, with nothing queued,
goes inline. With `direct` (the endpoint's uvicorn protocol), a frame that can
be written at once skips the ASGI send (`LeanSansIOProtocol.send_text_now`).
"""

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Protocol

from protocol.codes import CloseCode
from server.backends.base import BackendUnavailable, LoggedEvent
from server.continuation import Continuation
from server.redaction import frame_for_user

logger = logging.getLogger("cowrite.outbound")
BATCH = 64
BACKFILL_RETRY_FIRST_S = 0.05
BACKFILL_RETRY_MAX_S = 2.0


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


@dataclass(frozen=True, slots=True)
class _Unfinished:
    """An inline send that had to wait: the writer finishes it first."""

    send: Awaitable[object]
    seq: int  # 0 for a frame
    type: str


@dataclass(frozen=True, slots=True)
class _Failed:
    """An inline send that failed: the writer raises it."""

    error: Exception


class DirectWrite(Protocol):
    def send_text_now(self, text: str) -> bool: ...


_Item = _Frame | LoggedEvent | _Replay | CloseRequest | _Unfinished | _Failed
Backfill = Callable[[int, int], Awaitable[list[LoggedEvent] | None]]

def _size(item: _Item) -> int:
    if isinstance(item, LoggedEvent):
        return len(item.frame)
    return len(item.text) if isinstance(item, _Frame) else 0


class Outbound:
    """One connection's writer (see the module docstring). Slotted and lean:
    an idle connection holds this object, its deque and no more (the writer
    waits on a plain future created only while it is idle)."""

    __slots__ = ("_abandoned", "_backfill", "_busy", "_direct", "_held", "_inline", "_max_bytes",
                 "_max_events", "_on_idle", "_on_sent", "_queue", "_queued_bytes",
                 "_queued_events", "_send", "_task", "_user_id", "_waiter", "close_request",
                 "sent_seq")

    def __init__(
        self,
        send: Callable[[str], Awaitable[None]],
        *,
        max_events: int,
        backfill: Backfill,
        max_bytes: int = 0,
        user_id: str | None = None,
        on_sent: Callable[[str], None] = lambda _type: None,
        on_idle: Callable[[], None] = lambda: None,
        inline: bool = False,
        direct: DirectWrite | None = None,
    ) -> None:
        self._send = send
        self._inline = inline
        self._direct = direct
        self._max_events = max_events
        self._max_bytes = max_bytes
        self._backfill = backfill
        self._user_id = user_id
        self._on_sent = on_sent
        self._on_idle = on_idle
        self._queue: deque[_Item] | None = None  # none while idle: a deque is ~700 bytes
        self._held: list[LoggedEvent] | None = []  # live events that arrive before `begin`
        self._queued_events = 0
        self._queued_bytes = 0
        self._waiter: asyncio.Future[None] | None = None  # set while the writer is idle
        self._busy = False
        self._task: asyncio.Task[CloseRequest] | None = None
        self._abandoned = False
        self.sent_seq = 0
        self.close_request: CloseRequest | None = None

    @property
    def has_pending_send(self) -> bool:
        """Whether a send is under way or queued (a closing connection's never counts: it
        held the document's coalesced text for as long as its close took)."""
        return (self._busy or bool(self._queue)) and self.close_request is None

    @property
    def queued_bytes(self) -> int:
        return self._queued_bytes

    def begin(self, welcome: _Frame | None, start_seq: int, replay: list[LoggedEvent]) -> None:
        """Queue the welcome, then the replay, then live events seen meanwhile."""
        self.sent_seq = start_seq
        if welcome is not None:
            self._put(welcome)
        if replay:
            self._put(_Replay(replay))
        held, self._held = self._held or [], None
        for event in held:
            self.push_event(event)
        self._wakeup()

    def _put(self, item: _Item) -> None:
        queue = self._queue
        if queue is None:
            queue = self._queue = deque()
        queue.append(item)

    def _wakeup(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _idle(self) -> bool:
        """Inline sends allowed: the writer waits with nothing queued or in flight."""
        waiter = self._waiter
        return self._inline and waiter is not None and not waiter.done() and not self._queue

    def _send_now(self, text: str, type_: str, seq: int) -> None:
        direct = self._direct
        if direct is not None and direct.send_text_now(text):
            if seq:
                self.sent_seq = seq
            self._on_sent(type_)
            return
        coro = self._send(text)
        if not isinstance(coro, Coroutine):  # not a coroutine function: the writer awaits it
            self._put(_Unfinished(coro, seq, type_))
            self._wakeup()
            return
        try:
            waiting = coro.send(None)
        except StopIteration:
            if seq:
                self.sent_seq = seq
            self._on_sent(type_)
            return
        except Exception as exc:  # raised again by the writer, in its own task
            self._put(_Failed(exc))
        else:
            self._put(_Unfinished(Continuation(coro, waiting), seq, type_))
        self._wakeup()

    def push_frame(self, type_: str, text: str) -> None:
        if self.close_request is None:
            if self._idle():
                self._send_now(text, type_, 0)
                return
            self._queued_bytes += len(text)
            self._put(_Frame(type_, text))
            self._wakeup()
            self._check_bounds()

    def push_event(self, event: LoggedEvent) -> None:
        if self.close_request is not None:
            return
        if self._held is not None:
            self._held.append(event)
            return
        if event.seq == self.sent_seq + 1 and self._idle():
            self._send_now(self._frame_of(event), event.type, event.seq)
            return
        self._queued_events += 1
        self._queued_bytes += len(event.frame)
        self._put(event)
        self._wakeup()
        self._check_bounds()

    def _check_bounds(self) -> None:
        """Over `max_events` frames, or over `max_bytes` not counting the largest
        queued frame: one frame of any size (a long `message.done`, a big
        prompt in `run.started`) may wait, with up to `max_bytes` behind or
        before it. The scan for the largest runs only while over `max_bytes`."""
        over = self._queued_events > self._max_events
        if not over and self._max_bytes and self._queued_bytes > self._max_bytes:
            largest = max(_size(item) for item in self._queue or ())
            over = self._queued_bytes - largest > self._max_bytes
        if over:
            self.close(CloseRequest(CloseCode.SLOW_CONSUMER, "slow consumer: resume to catch up"),
                       drop_pending=True)

    def close(self, request: CloseRequest, *, drop_pending: bool = False) -> None:
        """Send what is queued (unless `drop_pending`), then close.

        With `drop_pending`, the queue goes at once, and a writer blocked in a
        send to a peer that does not read is abandoned (cancelled where it
        waits, before any byte of that frame is written), so the close can be
        performed now and the memory is freed."""
        if self.close_request is not None:
            return
        self.close_request = request
        if drop_pending:
            if self._queue is not None:
                self._queue.clear()
            self._queued_events = 0
            self._queued_bytes = 0
            task = self._task
            if self._busy and task is not None and task is not asyncio.current_task():
                self._abandoned = True
                task.cancel()
        self._put(request)
        self._wakeup()

    async def run(self) -> CloseRequest:
        """Send until a close is requested; return it for the endpoint to perform."""
        self._task = asyncio.current_task()
        try:
            return await self._run()
        except asyncio.CancelledError:
            task = self._task
            if self._abandoned and task is not None and task.uncancel() == 0 and \
                    self.close_request is not None:
                return self.close_request  # our own cancel: the peer is not reading
            raise

    async def _run(self) -> CloseRequest:
        while True:
            while not self._queue:
                self._busy = False
                self._queue = None  # freed while idle; `_put` makes a new one
                self._on_idle()
                if self._queue:
                    break
                self._waiter = asyncio.get_running_loop().create_future()
                try:
                    await self._waiter
                finally:
                    self._waiter = None
            self._busy = True
            queue = self._queue  # only this writer replaces it, and only while idle
            for _ in range(min(BATCH, len(queue))):
                item = queue.popleft()
                if isinstance(item, LoggedEvent):
                    self._queued_events -= 1
                    self._queued_bytes -= len(item.frame)
                    if not await self._send_event(item):
                        return self._lost_track()
                elif isinstance(item, _Frame):
                    self._queued_bytes -= len(item.text)
                    await self._write(item.text)
                    self._on_sent(item.type)
                elif isinstance(item, _Replay):
                    if not await self._send_replay(item.events):
                        return self._lost_track()
                elif isinstance(item, _Unfinished):
                    await item.send
                    if item.seq:
                        self.sent_seq = item.seq
                    self._on_sent(item.type)
                elif isinstance(item, _Failed):
                    raise item.error
                else:
                    return item
            del item  # an idle writer must not hold the last frame (the welcome, often)
            if self._queue:
                await asyncio.sleep(0)  # more to send: let other connections' writers run

    async def _send_replay(self, events: list[LoggedEvent]) -> bool:
        for event in events:
            if not await self._send_event(event):
                return False
        return True

    def _lost_track(self) -> CloseRequest:
        """The log no longer holds events this connection missed: make it resume."""
        self.close_request = CloseRequest(CloseCode.INTERNAL_ERROR,
                                          "missed events are no longer in the log; resume")
        return self.close_request

    async def _fill(self, after: int, until: int) -> list[LoggedEvent] | None:
        """Events after..until from the log, waiting out backend outages."""
        delay = BACKFILL_RETRY_FIRST_S
        while True:
            try:
                return await self._backfill(after, until)
            except BackendUnavailable as exc:
                if delay == BACKFILL_RETRY_FIRST_S:
                    logger.warning("backend unavailable while filling a gap (%s); retrying", exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, BACKFILL_RETRY_MAX_S)

    def _frame_of(self, event: LoggedEvent) -> str:
        """The event's frame as this connection may see it (`server.redaction`)."""
        if event.type == "tool.call":
            return frame_for_user(event.frame, self._user_id)
        return event.frame

    async def _write(self, text: str) -> None:
        direct = self._direct
        if direct is None or not direct.send_text_now(text):
            await self._send(text)

    async def _deliver(self, event: LoggedEvent) -> None:
        await self._write(self._frame_of(event))
        self.sent_seq = event.seq
        self._on_sent(event.type)

    async def _send_event(self, event: LoggedEvent) -> bool:
        if event.seq <= self.sent_seq:
            return True
        if event.seq > self.sent_seq + 1:
            missing = await self._fill(self.sent_seq, event.seq - 1)
            if missing is None:
                return False
            for earlier in missing:
                if earlier.seq == self.sent_seq + 1:
                    await self._deliver(earlier)
            if self.sent_seq != event.seq - 1:
                return False
        await self._deliver(event)
        return True
