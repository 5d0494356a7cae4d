"""`/v1/documents/{document_id}/ws`: the only module that touches the socket.

Lifecycle of one connection:
1. before accept: document id shape (404), Origin allow-list (403), the cap
   on sockets still handshaking (503, `COWRITE_MAX_PENDING_HANDSHAKES`);
2. accept (selecting `cowrite.v1` when offered), then `hello` within the
   timeout, authenticated and authorized (4001 / 4003 / 4008);
3. the ASGI task reads (limits, parsing, routing: `server.inbound`) while a
   second task writes (`Outbound`); the app's `ExpiryWheel` watches the
   token's expiry; when either ends, the other is cancelled, and the
   connection leaves its session. Nothing of the handshake (hello, token)
   stays referenced once the connection is live.

Every frame is checked at the edge (`decode_frame`): nesting depth
(`COWRITE_MAX_JSON_DEPTH`) and 64-bit integers, hello included; a refused
frame is `invalid_message`, counts toward the 4400 streak, and never reaches
the session.

Closing is bounded: the close frame waits at most `COWRITE_CLOSE_TIMEOUT_S`
to be written and as long again to leave the process; a peer that does not
read by then has its transport aborted, so a slow consumer's buffers are
freed instead of lingering in a zero-window connection. The transport is
found through `server.transport.TransportHandle`.
"""

import asyncio
import contextlib
import logging
import re
import uuid
from typing import Any

from starlette.datastructures import Headers
from starlette.responses import PlainTextResponse
from starlette.websockets import WebSocket, WebSocketDisconnect

from protocol.base import DOCUMENT_ID_PATTERN, SUBPROTOCOL
from protocol.client import VIEWER_ALLOWED_TYPES, AuthRefresh, ClientMessage, Hello, Ping
from protocol.codes import CloseCode, ErrorCode
from protocol.parsing import ParseFailure, decode_frame, peek_reply_to, validate_message
from protocol.server import Error, Pong
from server.auth import AuthError, Principal
from server.backends.base import BackendUnavailable
from server.connection import Connection
from server.inbound import Closing, admit, too_large
from server.limits import HandshakeGate, InvalidStreak, TokenBucket
from server.outbound import CloseRequest, Outbound
from server.services import Services
from server.session import DocumentSession
from server.tasks import ExpiryWheel
from server.transport import TRANSPORT_KEY, closer, finish_close
from server.wsprotocol import HELLO_MAX_BYTES, LeanSansIOProtocol, frame_limit, limit_messages

logger = logging.getLogger("cowrite.endpoint")
DOCUMENT_ID_RE = re.compile(DOCUMENT_ID_PATTERN)


def _header(ws: WebSocket, name: str) -> str | None:
    """A request header, read without `ws.headers`, which would keep a parsed
    copy on the connection for its whole life."""
    return Headers(scope=ws.scope).get(name)


async def close_bounded(ws: WebSocket, code: int, reason: str, timeout_s: float) -> None:
    """Send the close frame, really, even to a peer that does not read (see
    `server.transport.finish_close`)."""
    await finish_close(ws.close(code, reason), ws.scope.get(TRANSPORT_KEY), timeout_s)


async def document_socket(ws: WebSocket) -> None:
    services: Services = ws.app.state.services
    gate: HandshakeGate = ws.app.state.handshakes
    settings = services.settings
    document_id: str = ws.path_params["document_id"]
    if not DOCUMENT_ID_RE.fullmatch(document_id):
        await ws.send_denial_response(PlainTextResponse("unknown document", status_code=404))
        return
    origin = _header(ws, "origin")
    if origin is not None and not settings.origin_allowed(origin):
        logger.warning("refused origin %s", origin[:200], extra={"document_id": document_id})
        await ws.send_denial_response(PlainTextResponse("origin not allowed", status_code=403))
        return
    ticket = gate.enter(closer(ws.scope, services.metrics.handshakes_refused.inc))
    try:
        offered = [p.strip() for p in (_header(ws, "sec-websocket-protocol") or "").split(",")]
        limit_messages(ws.scope.get(TRANSPORT_KEY), HELLO_MAX_BYTES)  # until the hello
        await ws.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in offered else None)
    except BaseException:
        gate.leave(ticket)
        raise
    services.metrics.connections_open.inc()
    try:
        # Two phases, so that nothing of the handshake (the hello, its token,
        # the frames that read it) stays alive while the connection idles.
        opened = await _open(ws, services, gate, ticket, document_id)
        if opened is not None:
            await _live(ws, services, *opened)
    except WebSocketDisconnect:
        pass
    finally:
        services.metrics.connections_open.dec()


async def _refuse(ws: WebSocket, services: Services, code: CloseCode, error: Error | None) -> None:
    if error is not None:
        services.metrics.errors.labels(error.code).inc()
        with contextlib.suppress(Exception):
            await ws.send_text(error.to_json().decode())
    services.metrics.closes.labels(str(int(code))).inc()
    await close_bounded(ws, int(code), "", services.settings.close_timeout_s)


async def _read_hello(ws: WebSocket, services: Services) -> Hello | None:
    """The first frame as a valid `hello`, or None after refusing the connection."""
    settings = services.settings
    try:
        received = await asyncio.wait_for(ws.receive(), settings.hello_timeout_s)
    except TimeoutError:
        await _refuse(ws, services, CloseCode.UNAUTHENTICATED, Error(
            code=ErrorCode.NOT_READY, message="no hello within the timeout"))
        return None
    if received["type"] == "websocket.disconnect":
        return None
    text = received.get("text")
    if text is None or too_large(text, settings.max_message_bytes):
        await _refuse(ws, services, CloseCode.UNAUTHENTICATED, Error(
            code=ErrorCode.INVALID_MESSAGE, message="the first frame must be a hello JSON text"))
        return None
    decoded = decode_frame(text, settings.max_json_depth)
    if not isinstance(decoded, ParseFailure) and decoded.get("type") != "hello":
        await _refuse(ws, services, CloseCode.UNAUTHENTICATED, Error(
            code=ErrorCode.NOT_READY, message="the first message must be hello",
            reply_to=peek_reply_to(decoded)))
        return None
    result = decoded if isinstance(decoded, ParseFailure) else validate_message(decoded)
    if isinstance(result, Hello):
        services.metrics.messages_in.labels("hello").inc()
        return result
    failure = result if isinstance(result, ParseFailure) else ParseFailure(
        ErrorCode.INVALID_MESSAGE, "the first message must be hello")
    await _refuse(ws, services, CloseCode.UNAUTHENTICATED, Error(
        code=failure.code, message=failure.message, reply_to=failure.reply_to,
        details=failure.details))
    return None


def _bearer(ws: WebSocket) -> str | None:
    header = _header(ws, "authorization") or ""
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


async def _open(
    ws: WebSocket, services: Services, gate: HandshakeGate, ticket: int, document_id: str
) -> tuple[Connection, DocumentSession] | None:
    """The handshake: a valid `hello`, its token, the grant, the user's
    connection cap, then the join (welcome queued). Returns the joined
    connection, holding its cap slot, and its session; or None after
    refusing it."""
    try:
        hello = await _read_hello(ws, services)
    finally:
        gate.leave(ticket)
    if hello is None:
        return None
    try:
        principal = services.auth.verify(hello.token or _bearer(ws))
    except AuthError as exc:
        await _refuse(ws, services, CloseCode.UNAUTHENTICATED, Error(
            code=ErrorCode.INVALID_TOKEN, message=str(exc), reply_to=hello.id))
        return None
    if not principal.may_open(document_id):
        await _refuse(ws, services, CloseCode.FORBIDDEN, Error(
            code=ErrorCode.FORBIDDEN, message="this token does not grant the document",
            reply_to=hello.id))
        return None
    limit_messages(ws.scope.get(TRANSPORT_KEY), frame_limit(services.settings.max_message_bytes))
    limit = services.settings.max_connections_per_user
    connection_id = uuid.uuid4().hex
    try:
        if not await services.backend.acquire_connection(principal.user_id, connection_id, limit):
            await _refuse(ws, services, CloseCode.RATE_LIMITED, Error(
                code=ErrorCode.RATE_LIMITED, message=f"at most {limit} connections per user",
                reply_to=hello.id, retry_after_ms=1000))
            return None
        session = services.hub.get(document_id)
        conn = _connection(ws, services, session, hello, principal, connection_id)
        try:
            await session.join(conn, hello)
        except BaseException:
            await _leave(services, session, conn)
            raise
    except BackendUnavailable as exc:
        logger.warning("backend unavailable at connect: %s", exc,
                       extra={"document_id": document_id})
        await _refuse(ws, services, CloseCode.INTERNAL_ERROR, Error(
            code=ErrorCode.UNAVAILABLE, message="the shared backend is unavailable; reconnect "
            "with backoff", reply_to=hello.id, retry_after_ms=1000))
        return None
    logger.info("connected client %s", hello.client_id[:64], extra=conn.log_context)
    return conn, session


def _connection(ws: WebSocket, services: Services, session: DocumentSession, hello: Hello,
                principal: Principal, connection_id: str) -> Connection:
    settings, metrics, document_id = services.settings, services.metrics, session.document_id
    outbound = Outbound(
        ws.send_text,
        max_events=settings.outbound_queue_max,
        max_bytes=settings.outbound_max_bytes,
        user_id=principal.user_id,
        backfill=session.backfill,
        on_sent=metrics.count_sent,
        on_idle=session.on_writer_idle,
        inline=True,  # an idle writer's next frame is sent by its publisher (outbound.py)
        direct=_direct_write(ws),
    )
    conn = Connection(
        session_id=connection_id, document_id=document_id, client_id=hello.client_id,
        principal=principal, outbound=outbound, metrics=metrics,
    )
    conn.log_context = {
        "document_id": document_id, "user_id": principal.user_id, "connection_id": connection_id
    }
    return conn


def _direct_write(ws: WebSocket) -> LeanSansIOProtocol | None:
    """The connection's uvicorn protocol when it is ours: it can write a frame without
    the ASGI layers. The `WebSocket` keeps the server's own `receive` (the protocol's
    bound method; `DirectRoute` passes uvicorn's `send` on unwrapped as well), so the
    connection holds nothing more."""
    protocol = getattr(getattr(ws, "_receive", None), "__self__", None)
    return protocol if isinstance(protocol, LeanSansIOProtocol) else None


async def _leave(services: Services, session: DocumentSession, conn: Connection) -> None:
    """Undo `_open`: out of the session (and the hub, once idle), the cap slot freed."""
    try:
        await session.detach(conn)
        services.hub.release(session)
    finally:
        with contextlib.suppress(BackendUnavailable):
            await services.backend.release_connection(conn.user_id, conn.session_id)


class _WriterWatch:
    """The writer's done callback: it interrupts the connection's task, which
    reads in the meantime (a close was requested, or the writer failed). Only
    a read is interrupted: a message being handled is finished first (`busy`),
    since a cancel inside a `run.start` freed the document under a run that had
    started, which then streamed beside the next one, beyond anyone's cancel."""

    __slots__ = ("busy", "fired", "task")

    def __init__(self, task: "asyncio.Task[Any]") -> None:
        self.task: asyncio.Task[Any] | None = task
        self.fired = self.busy = False

    def __call__(self, _writer: "asyncio.Task[CloseRequest]") -> None:
        if self.task is not None:
            self.fired = True
            if not self.busy:
                self.task.cancel()


async def _live(ws: WebSocket, services: Services, conn: Connection,
                session: DocumentSession) -> None:
    """The joined connection: it reads in this (the ASGI) task while its writer
    runs in a second one; whichever ends first ends the other. The read loop
    is inlined and holds no message between frames, and the token's expiry is
    watched by the app's `ExpiryWheel`: an idle connection is this frame, the
    writer's task and its objects."""
    settings, metrics, outbound = services.settings, services.metrics, conn.outbound
    expiry = _expiry(ws)
    task = asyncio.current_task()
    assert task is not None
    writer = asyncio.create_task(outbound.run())
    watch = _WriterWatch(task)
    writer.add_done_callback(watch)
    failure: BaseException | None = None
    try:
        expiry.watch(conn)
        bucket = TokenBucket(settings.rate_messages_per_s, settings.rate_messages_per_s * 2)
        streak = InvalidStreak(settings.max_invalid_messages)
        try:
            # `task.cancelling()` is `cancel_requested()` (this is the running task) without
            # a `current_task` lookup per frame: a cancel lost in a Redis write must end it
            while not task.cancelling():
                received = await ws.receive()
                if received["type"] == "websocket.disconnect":
                    break
                message = admit(received.get("text"), services, conn, bucket, streak)
                del received
                if isinstance(message, Closing):
                    await _wait_for_writer()
                elif message is not None:
                    watch.busy = True
                    await _dispatch(services, session, conn, message, expiry)
                    watch.busy = False
                    del message
                    if watch.fired:
                        break
        except asyncio.CancelledError:
            if not watch.fired or task.uncancel():
                raise  # cancelled from outside, not (only) by the writer's end
        except WebSocketDisconnect:
            pass
        except Exception as exc:
            failure = exc
        watch.task = None
        if not writer.done():
            writer.cancel()
        await asyncio.gather(writer, return_exceptions=True)
        if not writer.cancelled() and failure is None:
            failure = writer.exception()
        if failure is not None and not isinstance(failure, WebSocketDisconnect):
            logger.error("connection task failed", exc_info=failure, extra=conn.log_context)
            await _refuse(ws, services, CloseCode.INTERNAL_ERROR, None)
        elif outbound.close_request is not None:
            request = outbound.close_request
            metrics.closes.labels(str(request.code)).inc()
            await close_bounded(ws, request.code, request.reason, settings.close_timeout_s)
    finally:
        watch.task = None
        expiry.unwatch(conn)
        if not writer.done():  # cancelled from outside
            writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)
        await _leave(services, session, conn)
        logger.info("disconnected", extra=conn.log_context)


def _expiry(ws: WebSocket) -> ExpiryWheel:
    """The app's expiry wheel, created with its first connection."""
    state = ws.app.state
    wheel: ExpiryWheel | None = getattr(state, "expiry_wheel", None)
    if wheel is None:
        wheel = state.expiry_wheel = ExpiryWheel()
    return wheel


async def _wait_for_writer() -> None:
    """After requesting a close: the writer flushes what is queued, then closes
    and ends the connection, which cancels this wait."""
    await asyncio.get_running_loop().create_future()


async def _dispatch(
    services: Services, session: DocumentSession, conn: Connection, message: ClientMessage,
    expiry: ExpiryWheel,
) -> None:
    if conn.is_viewer and message.type not in VIEWER_ALLOWED_TYPES:
        conn.error(ErrorCode.FORBIDDEN, "viewers may not send " + message.type,
                   reply_to=message.id)
        return
    if isinstance(message, Ping):
        conn.reply(Pong(ts=message.ts))
    elif isinstance(message, Hello):
        conn.error(ErrorCode.INVALID_MESSAGE, "hello was already received", reply_to=message.id)
    elif isinstance(message, AuthRefresh):
        _refresh(services, conn, message)
        expiry.watch(conn)
    else:
        try:
            await session.handle(conn, message)
        except BackendUnavailable as exc:
            logger.warning("backend unavailable while handling %s: %s", message.type, exc,
                           extra=conn.log_context)
            conn.error(ErrorCode.UNAVAILABLE, "the shared backend is unavailable; retry shortly",
                       reply_to=message.id, retry_after_ms=1000)
        except Exception:
            ref = uuid.uuid4().hex[:12]
            logger.exception("handling %s failed (ref %s)", message.type, ref,
                             extra=conn.log_context)
            conn.error(ErrorCode.INTERNAL, f"internal error (ref {ref})", reply_to=message.id)


def _refresh(services: Services, conn: Connection, message: AuthRefresh) -> None:
    try:
        principal = services.auth.verify(message.token)
    except AuthError as exc:
        conn.error(ErrorCode.INVALID_TOKEN, str(exc), reply_to=message.id)
        return
    if principal.user_id != conn.user_id:
        conn.error(ErrorCode.FORBIDDEN, "auth.refresh must keep the same sub",
                   reply_to=message.id)
        return
    if not principal.may_open(conn.document_id):
        conn.error(ErrorCode.FORBIDDEN, "the new token does not grant this document",
                   reply_to=message.id)
        return
    conn.principal = principal
    conn.ack(message.id, status="refreshed")
