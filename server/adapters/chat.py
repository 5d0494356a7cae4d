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

What the frontend never got is not lost (delivery.py): an answer the run
applied although its request failed, sent again, streams its segment again
(`ChatRuns.redelivery`), and a reconnect after the run ended replays the run
when its end never reached the frontend (`ChatRuns.undelivered_end`), both
from a `ChatRun` rebuilt from the log when the run has ended (`ended`).
The `ChatRun` class itself is in chat_run.py.
"""

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from protocol.client import RunStart
from protocol.codes import ErrorCode
from protocol.server import Error
from server.adapters import delivery
from server.adapters.adoption import run_events
from server.adapters.chat_run import (
    ChatKey,
    ChatRun,
    Item,
    Kind,
    Outcome,
    Pending,
    Translator,
)
from server.adapters.link import ResumeFailed, RunLink, new_message_id, parse_event
from server.auth import Principal
from server.backends.base import LoggedEvent
from server.redaction import frame_for_user
from server.services import Services

logger = logging.getLogger("cowrite.adapters")


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
        self._finishing: dict[ChatKey, ChatRun[Any]] = {}  # ended, answers still streaming

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
        epoch, last_seq, events = await run_events(
            self.services.backend, key[1], run_id, self.services.settings.log_max_events)
        run = await self._rebuilt(key, run_id, principal, client_id, translator, events)
        link = run.link
        try:
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

    async def _rebuilt(self, key: ChatKey, run_id: str, principal: Principal, client_id: str,
                       translator: Callable[[str], Translator[Item]],
                       events: list[LoggedEvent]) -> ChatRun[Item]:
        """A `ChatRun` of `run_id` with its link not yet open, fed the run's `events`
        as the live link would have handed them over (redacted for the user)."""
        link = RunLink(self.services, key[1], principal, client_id)
        run: ChatRun[Item] = ChatRun(key, link, run_id, translator(run_id), self._forget)
        link.on_event = run.on_event
        try:
            for logged in events:
                event = parse_event(frame_for_user(logged.frame, principal.user_id))
                if event is not None:
                    run.on_event(event)
        except BaseException:
            await link.close()
            raise
        return run

    async def ended(self, kind: str, document_id: str, chat_id: str, principal: Principal,
                    translator: Callable[[str], Translator[Item]]) -> ChatRun[Item] | None:
        """The chat's last run when it ended within `delivery.WINDOW_S` (the caller found
        no active one): the `ChatRun` this instance still streams from, else rebuilt
        from the document log; None when there is none, or it is not in the log."""
        key = (kind, document_id, chat_id, principal.user_id)
        finishing = self._finishing.get(key)
        if finishing is not None:
            return finishing
        backend, log_max = self.services.backend, self.services.settings.log_max_events
        client_id = f"{kind}:{chat_id}"
        run_id = await delivery.newest_ended_run(backend, document_id, client_id,
                                                 principal.user_id, log_max)
        if run_id is None:
            return None
        _, _, events = await run_events(backend, document_id, run_id, log_max)
        run = await self._rebuilt(key, run_id, principal, client_id, translator, events)
        if not run.finished:  # the log no longer holds its end: nothing to stream
            await run.link.close()
            return None
        return run

    async def undelivered_end(self, kind: str, document_id: str, chat_id: str,
                              principal: Principal,
                              translator: Callable[[str], Translator[Item]]
                              ) -> ChatRun[Item] | None:
        """For a reconnect that found no active run: the chat's last run, ended within
        `delivery.WINDOW_S`, when the frontend asked for its end (`end_asked_for`) and
        no request streamed it (claimed: replayed once)."""
        run = await self.ended(kind, document_id, chat_id, principal, translator)
        if run is None or not run.end_asked_for() or not await delivery.mark(
                self.services.backend, delivery.end_key(document_id, run.run_id)):
            return None
        return run

    async def redelivery(self, kind: str, document_id: str, chat_id: str,
                         principal: Principal, translator: Callable[[str], Translator[Item]],
                         active: ChatRun[Item] | None,
                         answered: Callable[[ChatRun[Item]], tuple[Kind, str, int] | None]
                         ) -> tuple[ChatRun[Item], int] | None:
        """For an answer to nothing pending: the run and the index to stream from when
        it is an answer the run applied (`answered`: which call, and its segment) whose
        segment no request streamed to its end, as when its first request was answered
        `unavailable` although it was applied (delivery.py). `active`: the chat's active
        run, if any; else its run that ended within `delivery.WINDOW_S`."""
        run = active if active is not None else await self.ended(
            kind, document_id, chat_id, principal, translator)
        found = answered(run) if run is not None else None
        start = await run.redeliver(*found) if run is not None and found is not None else None
        return None if run is None or start is None else (run, start)

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
        streaming = run.delivering_tasks() if run.finished else []
        if streaming:  # kept while its answers stream: `ended` finds it (not the log)
            self._finishing[run.key] = run
            for task in streaming:
                task.add_done_callback(lambda _task: self._let_go(run))

    def _let_go(self, run: ChatRun[Any]) -> None:
        if self._finishing.get(run.key) is run and not run.delivering_tasks():
            del self._finishing[run.key]

    async def close(self) -> None:
        for run in list(self.runs.values()):
            with contextlib.suppress(Exception):
                await run.link.close()
        self.runs.clear()


__all__ = ["ChatRun", "ChatRuns", "Outcome", "Pending", "Translator"]
