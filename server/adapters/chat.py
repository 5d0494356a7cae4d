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
client grace period, bound the wait. It leaves when the run finishes.
"""

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
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
from server.adapters.link import Answer, RunLink, new_message_id
from server.auth import Principal
from server.services import Services

logger = logging.getLogger("cowrite.adapters")
Item = TypeVar("Item")


class Translator(Protocol[Item]):
    """cowrite events -> frontend items; pure, with the state of one run."""

    def opening(self) -> list[Item]:
        """Items that open a segment (e.g. the AI SDK's `start`)."""
        ...

    def translate(self, event: ServerEvent, ours: bool) -> tuple[list[Item], bool]:
        """Items for one event of the run, and whether the segment ends with them.
        `ours`: a client tool call addressed to this adapter (the run's executor)."""
        ...


@dataclass
class Pending:
    """What the run waits for from the frontend."""

    kind: Literal["tool", "approval"]
    call_id: str
    name: str
    token: str | None = None


class ChatRun(Generic[Item]):
    def __init__(self, key: tuple[str, str, str], link: RunLink, run_id: str,
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
        self._wake = asyncio.Event()
        self._closer: asyncio.Task[None] | None = None
        self.items.extend(translator.opening())

    # -- events from the link --------------------------------------------------------
    def on_event(self, event: ServerEvent) -> None:
        if getattr(event, "run_id", None) != self.run_id or self.finished:
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
        self.items.extend(items)
        if isinstance(event, RunFinished):
            self.finished = ends = True
            self._closer = asyncio.get_running_loop().create_task(self._close())
        if ends:
            self.segment_open = False
        self._notify()

    def _notify(self) -> None:
        wake, self._wake = self._wake, asyncio.Event()
        wake.set()

    async def _close(self) -> None:
        self._on_done(self)
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
        """Deliver the frontend's answer; on success a new segment is open."""
        previous = (self.segment_start, self.segment_open, len(self.items))
        self.segment_start, self.segment_open = len(self.items), True
        self.items.extend(self.translator.opening())
        answer = await self.link.ask(message)
        if isinstance(answer, Error) or answer.duplicate:
            start, was_open, length = previous
            del self.items[length:]
            self.segment_start, self.segment_open = start, was_open
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
        return await self.link.ask(RunCancel(type="run.cancel", id=new_message_id(),
                                             run_id=self.run_id))


class ChatRuns:
    """The adapters' active runs on this instance, by (adapter, document, chat)."""

    def __init__(self, services: Services) -> None:
        self.services = services
        self.runs: dict[tuple[str, str, str], ChatRun[Any]] = {}

    def get(self, kind: str, document_id: str, chat_id: str) -> ChatRun[Any] | None:
        run = self.runs.get((kind, document_id, chat_id))
        return None if run is None or run.finished else run

    async def start(self, kind: str, document_id: str, chat_id: str, principal: Principal,
                    start: RunStart, translator: Translator[Item]
                    ) -> ChatRun[Item] | Error:
        """Start `start` as the run of this chat (client id `<kind>:<chat>`)."""
        key = (kind, document_id, chat_id)
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
        if not run.finished:
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
