"""One cowrite run seen through a frontend protocol: the shared half of the adapters.

A `ChatRun` holds the `RunLink` of one run started by an adapter, the run's
events translated into the frontend protocol's items (by a `Translator`), and
what the frontend must answer: the pending client tool call or approval.
The call's token never leaves the server; the frontend names the call by its
id (cowrite's `call_id` is used as the frontend's tool call id as is).

Items are kept for the whole run and split into *segments*: one HTTP
response (or WebSocket request) streams one segment, which ends when the
run waits on the frontend (a client tool call, an approval) or finishes.
The next request that carries the answer opens the next segment of the same
run. A resume replays every item of the run from its first, then follows
the live segment: the AI SDK's `resumeStreamIsReplay` contract.

The link stays attached while the run waits on the frontend, so the run's
executor is present and the usual tool and approval timeouts, not the
client grace period, bound the wait. It leaves when the run finishes, or
when the engine closes it (the document log reset, a drain, events lost):
then the live segment ends with an error (`Translator.lost`) and the
instance forgets the `ChatRun`, so the frontend's next request (its
reconnect, its answer) adopts the run again from the log.

A request may reach an instance other than the one that started the chat's
run (a load balancer that is not sticky): `ChatRuns.find` then rebuilds the
`ChatRun` there from the document log (adoption.py) and follows the run
live too; its answers reach the run's owner through the cluster link.
"""

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, Protocol, TypeVar

from protocol.client import Approval, RunCancel, RunStart, ToolResult
from protocol.codes import ErrorCode
from protocol.server import (
    ApprovalRequested,
    Error,
    RunFinished,
    ServerEvent,
    ToolCall,
    ToolDone,
)
from server.adapters.adoption import run_events
from server.adapters.link import Answer, ResumeFailed, RunLink, new_message_id, parse_event
from server.auth import Principal
from server.redaction import frame_for_user
from server.services import Services

logger = logging.getLogger("cowrite.adapters")
Item = TypeVar("Item")
ChatKey = tuple[str, str, str, str]  # (adapter, document, chat, user)


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

    kind: Literal["tool", "approval"]
    call_id: str
    name: str
    token: str | None = None


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
        self.finished = False
        self.gone = False  # the link was lost: this instance no longer follows the run
        self._wake = asyncio.Event()
        self._closer: asyncio.Task[None] | None = None
        self._answering = 0  # answers whose ack or error has not arrived yet
        self._answered = asyncio.Event()
        self.items.extend(translator.opening())
        link.on_lost = self.lost

    # -- events from the link --------------------------------------------------------
    def on_event(self, event: ServerEvent) -> None:
        if getattr(event, "run_id", None) != self.run_id or self.finished or self.gone:
            return
        ours = False
        if isinstance(event, ToolCall) and event.executor == "client":
            ours = event.client_id == self.link.conn.client_id
            if ours:
                self.pending[event.call_id] = Pending("tool", event.call_id, event.name,
                                                      event.token)
        elif isinstance(event, ApprovalRequested):
            self.pending[event.call_id] = Pending("approval", event.call_id, event.name)
        elif isinstance(event, ToolDone) or getattr(event, "type", "") == "approval.resolved":
            call_id = str(getattr(event, "call_id", ""))
            entry = self.pending.get(call_id)
            if entry is not None and (isinstance(event, ToolDone) or entry.kind == "approval"):
                del self.pending[call_id]
        items, ends = self.translator.translate(event, ours)
        if items and not self.segment_open and not self.finished:
            # The run went on without this instance opening the segment: the answer
            # went through another instance (or the run ended on its own).
            self.segment_start = len(self.items)
            self.items.extend(self.translator.opening())
            self.segment_open = True
        self.items.extend(items)
        if isinstance(event, RunFinished):
            self.finished = ends = True
            self._closer = asyncio.get_running_loop().create_task(self._close())
        if ends:
            self.segment_open = False
        self._notify()

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
        """Items from index `start` until the current segment ends."""
        index = start
        while True:
            wake = self._wake
            while index < len(self.items):
                yield self.items[index]
                index += 1
            if not self.segment_open:
                return
            await wake.wait()

    async def answer(self, message: ToolResult | Approval) -> Answer:
        """Deliver the frontend's answer; on success a new segment is open. A refused
        answer withdraws the segment's opening, unless events followed it (they
        are the run's, e.g. its end, and stay in the segment they opened)."""
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
                        reason=reason)

    async def cancel(self) -> Answer:
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


@dataclass
class _Turnstile:
    """One adoption of a chat at a time; kept while a request uses it."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0


class ChatRuns:
    """The adapters' active runs on this instance, by (adapter, document, chat, user):
    the runs it started, and those another instance started that a request here
    answered or reconnected to (`find`). The user is part of the key: chat ids are
    the frontend's and every collaborator sees them (the client id `<kind>:<chat>`),
    so another user's request naming the same chat (queued with `if_busy: enqueue`,
    say) gets a run of its own instead of taking this one's place."""

    def __init__(self, services: Services) -> None:
        self.services = services
        self.runs: dict[ChatKey, ChatRun[Any]] = {}
        self._adopting: dict[ChatKey, _Turnstile] = {}

    def get(self, kind: str, document_id: str, chat_id: str, user_id: str
            ) -> ChatRun[Any] | None:
        run = self.runs.get((kind, document_id, chat_id, user_id))
        return None if run is None or run.finished or run.gone else run

    async def find(self, kind: str, document_id: str, chat_id: str, principal: Principal,
                   translator: Callable[[str], Translator[Item]]
                   ) -> ChatRun[Item] | Error | None:
        """The chat's active run, wherever it started; None when it has none.

        A run started through another instance is rebuilt here from the document
        log (adoption.py) with `translator(run_id)`, then followed live; the user
        must be the run's (else a `forbidden` error, as for a run of this
        instance). One request of a chat adopts at a time (its turnstile), so an
        instance adopts a run once, and keeps it until it finishes, like the runs
        it started."""
        found = self.get(kind, document_id, chat_id, principal.user_id)
        if found is not None:
            return found
        record = await self.services.backend.active_run(document_id)
        client_id = f"{kind}:{chat_id}"
        if record is None or record.get("client_id") != client_id:
            return None
        if record.get("user_id") != principal.user_id:
            return Error(code=ErrorCode.FORBIDDEN, message="only the run's user may answer "
                         "or follow it")
        key = (kind, document_id, chat_id, principal.user_id)
        turnstile = self._adopting.setdefault(key, _Turnstile())
        turnstile.users += 1
        try:
            async with turnstile.lock:
                found = self.get(kind, document_id, chat_id, principal.user_id)
                if found is not None:
                    return found
                return await self._adopt(key, str(record["run_id"]), principal, client_id,
                                         translator)
        finally:
            turnstile.users -= 1
            if not turnstile.users:
                del self._adopting[key]

    async def followable(self, kind: str, document_id: str, chat_id: str,
                         principal: Principal, translator: Callable[[str], Translator[Item]]
                         ) -> ChatRun[Item] | None:
        """`find` for a reconnect: the chat's active run when `principal` is its user,
        else None (the frontend is told there is nothing to follow)."""
        found = await self.find(kind, document_id, chat_id, principal, translator)
        if found is None or isinstance(found, Error) \
                or found.link.conn.user_id != principal.user_id:
            return None
        return found

    async def _adopt(self, key: ChatKey, run_id: str, principal: Principal,
                     client_id: str, translator: Callable[[str], Translator[Item]]
                     ) -> ChatRun[Item] | None:
        document_id = key[1]
        epoch, last_seq, events = await run_events(
            self.services.backend, document_id, run_id, self.services.settings.log_max_events)
        view = translator(run_id)
        link = RunLink(self.services, document_id, principal, client_id)
        run: ChatRun[Item] = ChatRun(key, link, run_id, view, self._forget)
        link.on_event = run.on_event
        try:
            for logged in events:  # as the live link would see them (redacted for the user)
                event = parse_event(frame_for_user(logged.frame, principal.user_id))
                if event is not None:
                    run.on_event(event)
            if run.finished:
                return None  # its closer releases the link
            await link.open(after=(epoch, last_seq))  # caught up with the log when it returns
        except BaseException:
            await link.close()
            raise
        if run.finished:
            return None
        if run.gone:  # the engine closed the link meanwhile (it has left): a retry adopts
            raise ResumeFailed("the link to the document closed while adopting the run")
        self.runs[key] = run
        logger.info("adapter run %s adopted from the log (%d events)", run_id, len(events),
                    extra=link.conn.log_context)
        return run

    async def start(self, kind: str, document_id: str, chat_id: str, principal: Principal,
                    start: RunStart, translator: Translator[Item]
                    ) -> ChatRun[Item] | Error:
        """Start `start` as the run of this chat (client id `<kind>:<chat>`)."""
        key = (kind, document_id, chat_id, principal.user_id)
        run_id = start.run_id or f"run_{new_message_id()}"
        message = start.model_copy(update={"run_id": run_id, "id": new_message_id()})
        link = RunLink(self.services, document_id, principal, f"{kind}:{chat_id}")
        run: ChatRun[Item] = ChatRun(key, link, run_id, translator, self._forget)
        link.on_event = run.on_event
        try:
            await link.open()
            answer = await link.ask(message)
        except BaseException:
            await link.close()
            raise
        if isinstance(answer, Error) or answer.duplicate:
            await link.close()
            if isinstance(answer, Error):
                return answer
            return Error(code=ErrorCode.INVALID_MESSAGE,
                         message=f"run {run_id!r} already exists; use a new run id")
        if not run.finished and not run.gone:
            self.runs[key] = run
        return run

    def _forget(self, run: ChatRun[Any]) -> None:
        if self.runs.get(run.key) is run:
            del self.runs[run.key]

    async def close(self) -> None:
        for run in list(self.runs.values()):
            with contextlib.suppress(Exception):
                await run.link.close()
        self.runs.clear()


__all__ = ["ChatRun", "ChatRuns", "Pending", "Translator"]
