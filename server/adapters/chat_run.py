"""One cowrite run seen through a frontend protocol (chat.py's module doc).

A `ChatRun` holds the run's events translated into the frontend's items, split
into segments (one request streams one), what the run waits on from the
frontend (`pending`), and how each of those waits ended (`outcomes`, with the
segment that followed), so that an answer the run applied can be recognised
when the frontend sends it again because it never got the segment
(delivery.py). A request that streamed a segment to its end marks it
delivered in the shared backend (`_delivered`).
"""

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, Literal, Protocol, TypeVar

from protocol.base import NOTE_MAX_CHARS
from protocol.client import Approval, RunCancel, ToolResult
from protocol.codes import ErrorCode
from protocol.server import (
    ApprovalRequested,
    ApprovalResolved,
    Error,
    RunFinished,
    ServerEvent,
    ToolCall,
    ToolDone,
)
from server.adapters import delivery
from server.adapters.link import Answer, RunLink, new_message_id

Item = TypeVar("Item")
ChatKey = tuple[str, str, str, str]  # (adapter, document, chat, user)
Kind = Literal["tool", "approval"]
ANSWERED = frozenset({"ok", "error", "approve", "reject"})
"""Outcome statuses of a wait the frontend (or another tab) answered."""


class Translator(Protocol[Item]):
    """cowrite events -> frontend items; pure, with the state of one run."""

    def opening(self) -> list[Item]:
        """Items that open a segment (e.g. the AI SDK's `start`)."""
        ...

    def translate(self, event: ServerEvent, ours: bool) -> tuple[list[Item], bool]:
        """Items for one event of the run, and whether the segment ends with them.
        `ours`: a client tool call addressed to this adapter (the run's executor)."""
        ...

    def lost(self, message: str) -> list[Item]:
        """Items that end a segment whose link the engine closed (the run goes on)."""
        ...


@dataclass
class Pending:
    """What the run waits for from the frontend."""

    kind: Kind
    call_id: str
    name: str
    token: str | None = None


@dataclass(frozen=True)
class Outcome:
    """How a wait on the frontend ended: a `tool.done` (`status`, `output`, `error`) or
    an approval's `decision` (as `status`); `segment` is the index of the items where
    the segment that went on after it starts; `ts` when it was logged."""

    kind: Kind
    status: str
    segment: int
    ts: int | None
    output: Any = None
    error: dict[str, Any] | None = None


class ChatRun(Generic[Item]):
    def __init__(self, key: ChatKey, link: RunLink, run_id: str,
                 translator: Translator[Item], on_done: Callable[["ChatRun[Item]"], None]
                 ) -> None:
        self.key = key
        self.link = link
        self.run_id = run_id
        self.translator = translator
        self._on_done = on_done
        self.items: list[Item] = []
        self.segment_start = 0
        self.segment_open = True
        self.pending: dict[str, Pending] = {}
        self.outcomes: dict[tuple[Kind, str], Outcome] = {}
        self.finished = False
        self.gone = False  # the link was lost: this instance no longer follows the run
        self._wake = asyncio.Event()
        self._closer: asyncio.Task[None] | None = None
        self._answering = 0  # answers whose ack or error has not arrived yet
        self._answered = asyncio.Event()
        self._delivering: dict[str, asyncio.Task[Any]] = {}  # call -> the request answering
        self._marked: set[str] = set()  # delivery marks this instance claimed
        self.items.extend(translator.opening())
        link.on_lost = self.lost

    # -- events from the link --------------------------------------------------------
    def on_event(self, event: ServerEvent) -> None:
        if getattr(event, "run_id", None) != self.run_id or self.finished or self.gone:
            return
        ours = False
        resolved: Pending | None = None
        if isinstance(event, ToolCall) and event.executor == "client":
            ours = event.client_id == self.link.conn.client_id
            if ours:
                self.pending[event.call_id] = Pending("tool", event.call_id, event.name,
                                                      event.token)
        elif isinstance(event, ApprovalRequested):
            self.pending[event.call_id] = Pending("approval", event.call_id, event.name)
        elif isinstance(event, (ToolDone, ApprovalResolved)):
            entry = self.pending.get(event.call_id)
            if entry is not None and (isinstance(event, ToolDone) or entry.kind == "approval"):
                resolved = self.pending.pop(event.call_id)
        items, ends = self.translator.translate(event, ours)
        if items and not self.segment_open and not self.finished:
            # The run went on without this instance opening the segment: the answer
            # went through another instance (or the run ended on its own).
            self.segment_start = len(self.items)
            self.items.extend(self.translator.opening())
            self.segment_open = True
        self.items.extend(items)
        if resolved is not None:  # the run goes on in the open segment, or the next one
            self._record(resolved, event)
        if isinstance(event, RunFinished):
            self.finished = ends = True
            self._closer = asyncio.get_running_loop().create_task(self._close())
        if ends:
            self.segment_open = False
        self._notify()

    def _record(self, resolved: Pending, event: ServerEvent) -> None:
        segment = self.segment_start if self.segment_open else len(self.items)
        ts = getattr(event, "ts", None)
        if isinstance(event, ApprovalResolved):
            outcome = Outcome(resolved.kind, event.decision, segment, ts)
        else:
            assert isinstance(event, ToolDone)
            outcome = Outcome(resolved.kind, event.status, segment, ts, event.output,
                              event.error)
        self.outcomes[(resolved.kind, resolved.call_id)] = outcome

    def lost(self, reason: str) -> None:
        """The engine closed the link (`RunLink.on_lost`): the run goes on without this
        instance. The live segment ends with an error telling the frontend to reconnect,
        and the chat is forgotten: its next request adopts the run again (adoption.py)."""
        if self.finished or self.gone:
            return
        self.gone = True
        if self.segment_open:
            self.items.extend(self.translator.lost(
                f"connection to the document lost ({reason}); reconnect"))
            self.segment_open = False
        self._on_done(self)
        self._notify()

    def _notify(self) -> None:
        wake, self._wake = self._wake, asyncio.Event()
        wake.set()

    async def _close(self) -> None:
        """Leave once the run finished, but not before the answers in flight have theirs:
        with several instances `run.finished` may arrive before the ack of the result
        that finished the run (each `ask` waits at most `REPLY_TIMEOUT_S`)."""
        self._on_done(self)
        while self._answering:
            await self._answered.wait()
        await self.link.close()

    # -- what requests do ---------------------------------------------------------
    async def follow(self, start: int) -> AsyncIterator[Item]:
        """Items from index `start` until the current segment ends; then what was
        streamed is marked delivered (a stream cut short marks nothing)."""
        index = start
        while True:
            wake = self._wake
            while index < len(self.items):
                yield self.items[index]
                index += 1
            if not self.segment_open:
                break
            await wake.wait()
        await self._delivered(start, index)

    async def _delivered(self, start: int, end: int) -> None:
        """Mark the segments that items `start` to `end` completed (delivery.py): those
        that followed an answer, and the run's end."""
        if self.gone:  # ended by `lost`: the frontend was told to reconnect
            return
        document_id = self.link.document_id
        keys = [delivery.answer_key(document_id, self.run_id, kind, call_id)
                for (kind, call_id), outcome in self.outcomes.items()
                if start <= outcome.segment < end]
        if self.finished and end >= len(self.items):
            keys.append(delivery.end_key(document_id, self.run_id))
        for key in keys:
            if key not in self._marked:
                self._marked.add(key)
                await delivery.mark(self.link.services.backend, key)

    def delivering(self, call_id: str) -> bool:
        """Whether a request of this instance is answering `call_id` or streaming what
        followed its answer (a concurrent repeat of the answer is refused)."""
        task = self._delivering.get(call_id)
        return task is not None and not task.done()

    def delivering_tasks(self) -> list[asyncio.Task[Any]]:
        return [task for task in self._delivering.values() if not task.done()]

    def applied(self, kind: Kind, call_id: str, status: str, output: Any = None,
                error_message: str | None = None) -> int | None:
        """The segment that followed the frontend's answer to `call_id` when the run
        applied this very answer within `delivery.WINDOW_S` (a tool's `status` "ok"
        with `output`, or "error" with `error_message`; an approval's decision), and
        no request here is delivering it; else None."""
        outcome = self.outcomes.get((kind, call_id))
        if outcome is None or outcome.status != status or self.delivering(call_id) \
                or not delivery.recent(outcome.ts):
            return None
        if kind == "tool" and (outcome.output != output if status == "ok" else
                               (outcome.error or {}).get("message") != error_message):
            return None
        return outcome.segment

    def end_asked_for(self) -> bool:
        """Whether the frontend asked for the segment that holds the run's end: the
        run's first (the prompt's) or one that the frontend's answer opened; not one the
        run went on in by itself after a wait that ended unanswered (the run ended while
        the frontend held a call or approval: cancelled, timed out)."""
        last = next(reversed(self.outcomes.values()), None)
        return last is None or last.status in ANSWERED

    def latest_answered(self, keys: Iterable[tuple[Kind, str]]) -> tuple[Kind, str] | None:
        """Of `keys` (kind, call id), the wait that ended last (its segment is the latest)."""
        found = [(outcome.segment, key) for key in keys
                 if (outcome := self.outcomes.get(key)) is not None]
        return max(found)[1] if found else None

    async def redeliver(self, kind: Kind, call_id: str, segment: int) -> int | None:
        """Where to stream the segment after this answer again from, when no request
        streamed it to its end (delivery.py; claimed, so at most once more). A segment
        the run has not opened yet (no event of it came) is opened, as `answer` opens
        one: the stream then waits for it instead of ending at once."""
        key = delivery.answer_key(self.link.document_id, self.run_id, kind, call_id)
        if not await delivery.mark(self.link.services.backend, key):
            return None
        if segment >= len(self.items) and not self.segment_open and not self.finished \
                and not self.gone:
            self.segment_start = segment = len(self.items)
            self.items.extend(self.translator.opening())
            self.segment_open = True
            self._notify()
        return segment

    async def answer(self, message: ToolResult | Approval) -> Answer:
        """Deliver the frontend's answer; on success a new segment is open. A refused
        answer withdraws the segment's opening, unless events followed it (they
        are the run's, e.g. its end, and stay in the segment they opened). A repeat
        while another request of this instance delivers the same call is refused."""
        if self.delivering(message.call_id):
            return Error(code=ErrorCode.CALL_NOT_PENDING, message=f"call "
                         f"{message.call_id!r} is being answered", reply_to=message.id)
        task = asyncio.current_task()
        if task is not None:  # until this request's stream ends
            self._delivering[message.call_id] = task
        previous = (self.segment_start, self.segment_open, len(self.items))
        self.segment_start, self.segment_open = len(self.items), True
        self.items.extend(self.translator.opening())
        opened = len(self.items)
        answer: Answer | None = None
        try:
            answer = await self._ask(message)
        finally:  # a request cancelled while asking withdraws its opening too
            refused = answer is None or isinstance(answer, Error) or answer.duplicate
            if refused and len(self.items) == opened:
                start, was_open, length = previous
                del self.items[length:]
                self.segment_start, self.segment_open = start, was_open
                self._notify()  # a reader of the withdrawn segment stops
            if refused and task is not None and self._delivering.get(message.call_id) is task:
                del self._delivering[message.call_id]
        return answer

    def tool_result(self, call_id: str, output: Any = None,
                    error: dict[str, Any] | None = None) -> ToolResult | None:
        entry = self.pending.get(call_id)
        if entry is None or entry.kind != "tool" or entry.token is None:
            return None
        fields: dict[str, Any] = {"error": error} if error is not None else {"output": output}
        return ToolResult(type="tool.result", id=new_message_id(), run_id=self.run_id,
                          call_id=call_id, token=entry.token, **fields)

    def approval(self, call_id: str, approved: bool, reason: str | None = None
                 ) -> Approval | None:
        entry = self.pending.get(call_id)
        if entry is None or entry.kind != "approval":
            return None
        return Approval(type="approval", id=new_message_id(), run_id=self.run_id,
                        call_id=call_id, decision="approve" if approved else "reject",
                        reason=None if reason is None else reason[:NOTE_MAX_CHARS])  # a
        # frontend's text, cut to what a WebSocket client may send (it failed the request)

    async def cancel(self) -> Answer:
        # The frontend asked to stop: the run's end is no longer one it waits for (a
        # reload within delivery.WINDOW_S replayed the stopped run as a new message).
        key = delivery.end_key(self.link.document_id, self.run_id)
        if key not in self._marked:
            self._marked.add(key)
            await delivery.mark(self.link.services.backend, key)
        return await self._ask(RunCancel(type="run.cancel", id=new_message_id(),
                                         run_id=self.run_id))

    async def _ask(self, message: ToolResult | Approval | RunCancel) -> Answer:
        """`link.ask`, counted: the link stays until every answer has arrived (`_close`)."""
        self._answering += 1
        try:
            return await self.link.ask(message)
        finally:
            self._answering -= 1
            if not self._answering:
                answered, self._answered = self._answered, asyncio.Event()
                answered.set()


__all__ = ["ChatKey", "ChatRun", "Item", "Kind", "Outcome", "Pending", "Translator"]
