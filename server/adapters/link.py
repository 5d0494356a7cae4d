"""An adapter's seat in a document session: a `Connection` without a socket.

The adapters (HTTP tool results, AI SDK, AG-UI) are translations with no run
logic of their own. Each one attaches a `RunLink` to the document session:
an ordinary `Connection` whose `Outbound` writer hands every frame (the
durable events of the document, seq-ordered and gapless, and the acks and
errors answering this link's messages) to a callback instead of a socket.
Messages go to the session exactly as the WebSocket endpoint sends them, so
admission, tokens, limits and the cluster link (a run owned by another
instance answers through this instance's inbox, to this connection) are the
engine's, not the adapter's.

The engine may close the connection itself, as it closes a WebSocket: the
document log reset (Redis lost it), the instance drains (SIGTERM), the log
no longer holds events the writer missed. A WebSocket client then resumes;
a link cannot, so when its writer ends without `close` the link closes
itself (`_writer_ended`): its waiters get `unavailable`, it leaves the
session (so it no longer counts as the run's executor, and a drain does not
wait for it), and `on_lost` tells its owner (`ChatRun.lost`), which ends the
stream with an error and lets the next request adopt the run again.
"""

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable
from typing import Any

import orjson
from pydantic import ValidationError

from protocol.client import ClientMessage, Hello, ResumePoint
from protocol.codes import ErrorCode
from protocol.server import SERVER_EVENT_ADAPTER, Ack, Error, ServerEvent, Welcome
from server.auth import Principal
from server.backends.base import BackendUnavailable
from server.connection import Connection
from server.outbound import CloseRequest, Outbound
from server.services import Services
from server.session import DocumentSession

logger = logging.getLogger("cowrite.adapters")
REPLY_TIMEOUT_S = 10.0
CATCH_UP_S = 2.0
"""How long `catch_up` waits for the events another instance logged to arrive here."""

Answer = Ack | Error


class ResumeFailed(BackendUnavailable):
    """A link that was to follow on from a seq could not: the log no longer holds
    the events after it (its epoch changed, or it was trimmed past them), or they
    did not arrive in time. Like the backend being unavailable, a retry starts
    afresh from the log."""


class RunLink:
    """A connection of the adapter to one document session (see module doc)."""

    def __init__(self, services: Services, document_id: str, principal: Principal,
                 client_id: str, on_event: Callable[[ServerEvent], None] = lambda _e: None
                 ) -> None:
        self.services = services
        self.document_id = document_id
        self.on_event = on_event
        self.on_lost: Callable[[str], None] = lambda _reason: None
        """Called once if the engine closes the link (see module doc), with why."""
        self.session: DocumentSession = services.hub.get(document_id)
        self._waiting: dict[str, asyncio.Future[Answer]] = {}
        settings = services.settings
        self.outbound = Outbound(
            self._receive, max_events=settings.outbound_queue_max, max_bytes=0,
            user_id=principal.user_id, backfill=self._backfill,
            on_idle=self.session.on_writer_idle)
        self.conn = Connection(
            session_id=f"adapter-{uuid.uuid4().hex}", document_id=document_id,
            client_id=client_id, principal=principal, outbound=self.outbound,
            metrics=services.metrics,
            log_context={"document_id": document_id, "user_id": principal.user_id})
        self._writer: asyncio.Task[Any] | None = None
        self._leaving: asyncio.Task[None] | None = None
        self.closed = False
        self.last_seq = 0  # of the last durable event handed to `on_event`
        self._caught_up: tuple[int, asyncio.Future[None]] | None = None

    async def _backfill(self, after: int, until: int) -> Any:
        backend = self.services.backend
        head = await backend.head(self.document_id)
        result = await backend.read_after(self.document_id, head.epoch, after, until)
        return result if isinstance(result, list) else None

    async def _receive(self, frame: str) -> None:
        """The writer's `send`: parse and route one frame (never blocks)."""
        event = parse_event(frame)
        if event is None:
            logger.warning("adapter link got an unreadable frame", extra=self.conn.log_context)
            return
        if isinstance(event, Welcome):
            return
        if isinstance(event, (Ack, Error)):
            waiter = self._waiting.pop(event.reply_to or "", None)
            if waiter is not None and not waiter.done():
                waiter.set_result(event)
            return
        self.on_event(event)
        seq = getattr(event, "seq", None)
        if isinstance(seq, int):
            self.last_seq = seq
            caught_up = self._caught_up
            if caught_up is not None and seq >= caught_up[0] and not caught_up[1].done():
                caught_up[1].set_result(None)

    async def open(self, after: tuple[str, int] | None = None) -> None:
        """Join the session and start the writer: live events from now on, or with
        `after` = (epoch, seq) every event after that seq first (the session's
        resume), all of them handed to `on_event` before this returns, so the
        caller sees the run as it is now. `ResumeFailed` when they cannot be."""
        resume = None if after is None else ResumePoint(epoch=after[0], after_seq=after[1])
        welcome = await self.session.join(self.conn, Hello(
            type="hello", client_id=self.conn.client_id, resume=resume))
        self._writer = asyncio.get_running_loop().create_task(self.outbound.run())
        self._writer.add_done_callback(self._writer_ended)
        if after is None:
            return
        if welcome.resume_failed is not None:
            raise ResumeFailed(f"the document log could not resume: {welcome.resume_failed}")
        self.last_seq = max(self.last_seq, after[1])
        if self.last_seq < welcome.last_seq:
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._caught_up = (welcome.last_seq, done)
            try:
                await asyncio.wait_for(done, REPLY_TIMEOUT_S)
            except TimeoutError:
                raise ResumeFailed("the document's events did not arrive in time") from None
            finally:
                self._caught_up = None

    async def catch_up(self, timeout_s: float = CATCH_UP_S) -> None:
        """Until every event the log holds now has been handed to `on_event` (or
        `timeout_s`). Another instance's events reach this one by pub/sub a few ms after
        they are logged: a frontend's answer posted here right after the run asked for
        it elsewhere found no pending call and was refused 409 (seen under load)."""
        head = await self.services.backend.head(self.document_id)
        if self.last_seq >= head.last_seq or self._caught_up is not None or self.closed:
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._caught_up = (head.last_seq, done)
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done, timeout_s)
        finally:
            self._caught_up = None

    async def ask(self, message: ClientMessage) -> Answer:
        """Hand `message` (whose `id` must be set) to the session; its ack or error.

        The session answers through this link's writer, in order with the
        document's events, so the answer arrives after any event it caused."""
        assert message.id is not None
        if self.closed:  # the engine closed the link: its answer could never arrive
            return Error(code=ErrorCode.UNAVAILABLE, message="the adapter's link to the "
                         "document closed; retry shortly", reply_to=message.id,
                         retry_after_ms=1000)
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._waiting[message.id] = future
        try:
            await self.session.handle(self.conn, message)
            return await asyncio.wait_for(asyncio.shield(future), REPLY_TIMEOUT_S)
        except BackendUnavailable:
            return Error(code=ErrorCode.UNAVAILABLE, message="the shared backend is unavailable; "
                         "retry shortly", reply_to=message.id, retry_after_ms=1000)
        except TimeoutError:
            return Error(code=ErrorCode.UNAVAILABLE, message="no answer from the run in time; "
                         "retry shortly", reply_to=message.id, retry_after_ms=1000)
        except Exception:
            ref = uuid.uuid4().hex[:12]
            logger.exception("adapter message %s failed (ref %s)", message.type, ref,
                             extra=self.conn.log_context)
            return Error(code=ErrorCode.INTERNAL, message=f"internal error (ref {ref})",
                         reply_to=message.id)
        finally:
            self._waiting.pop(message.id, None)

    async def close(self) -> None:
        """Leave the session; the hub forgets it when nothing else holds it. A
        message still waiting for its answer gets `unavailable` at once, not
        after `REPLY_TIMEOUT_S`: its answer can no longer arrive."""
        if self.closed:
            return
        self._end("the adapter's link to the document closed before the run answered")
        writer = self._writer
        if writer is not None:
            writer.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await writer
        await self._leave()

    def _end(self, why: str) -> None:
        """Closed from now on: every waiter learns it at once."""
        self.closed = True
        for message_id, waiter in list(self._waiting.items()):
            if not waiter.done():
                waiter.set_result(Error(code=ErrorCode.UNAVAILABLE, message=f"{why}; retry "
                                        "shortly", reply_to=message_id, retry_after_ms=1000))
        caught_up = self._caught_up
        if caught_up is not None and not caught_up[1].done():
            caught_up[1].set_exception(ResumeFailed(why))

    async def _leave(self) -> None:
        with contextlib.suppress(Exception):
            await self.session.detach(self.conn)
        self.services.hub.release(self.session)

    def _writer_ended(self, writer: "asyncio.Task[Any]") -> None:
        """The writer ended, not by `close`: the engine closed the link (module doc)."""
        if self.closed:
            return
        if writer.cancelled():
            reason = "its writer was cancelled"
        elif writer.exception() is not None:
            reason = f"internal error (ref {uuid.uuid4().hex[:12]})"
            logger.error("adapter link's writer failed: %s", reason,
                         exc_info=writer.exception(), extra=self.conn.log_context)
        else:
            request = writer.result()
            reason = request.reason if isinstance(request, CloseRequest) else "closed"
        logger.info("adapter link closed by the server: %s", reason,
                    extra=self.conn.log_context)
        self._end("the adapter's link to the document closed")
        self._leaving = asyncio.get_running_loop().create_task(self._leave())
        try:
            self.on_lost(reason)
        except Exception:
            logger.exception("adapter link: on_lost failed", extra=self.conn.log_context)


def parse_event(frame: str) -> ServerEvent | None:
    """A server frame (a logged event's or a writer's) as its event; None if unreadable."""
    try:
        return SERVER_EVENT_ADAPTER.validate_python(orjson.loads(frame))
    except (orjson.JSONDecodeError, ValidationError):
        return None


def new_message_id() -> str:
    return uuid.uuid4().hex[:16]
