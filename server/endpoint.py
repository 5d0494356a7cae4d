"""`/v1/documents/{document_id}/ws`: the only module that touches the socket.

Lifecycle of one connection:
1. before accept: document id shape (404), Origin allow-list (403), the cap
   on sockets still handshaking (503, `COWRITE_MAX_PENDING_HANDSHAKES`);
2. accept (selecting `cowrite.v1` when offered), then `hello` within the
   timeout, authenticated and authorized (4001 / 4003 / 4008);
3. two tasks, the reader (limits, parsing, routing) and the writer
   (`Outbound`), plus a loop timer for the token's expiry; when one task
   ends, the other is cancelled, and the connection leaves its session.

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

from starlette.responses import PlainTextResponse
from starlette.websockets import WebSocket, WebSocketDisconnect

from protocol.base import DOCUMENT_ID_PATTERN, SUBPROTOCOL
from protocol.client import VIEWER_ALLOWED_TYPES, AuthRefresh, ClientMessage, Hello, Ping
from protocol.codes import CloseCode, ErrorCode
from protocol.parsing import ParseFailure, decode_frame, peek_reply_to, validate_message
from protocol.server import Error, Pong
from server.auth import AuthError, Principal
from server.backends.base import BackendUnavailable, cancel_requested
from server.connection import Connection
from server.limits import HandshakeGate, InvalidStreak, TokenBucket
from server.outbound import Outbound
from server.services import Services
from server.tasks import ExpiryTimer, first_done
from server.transport import TRANSPORT_KEY, finish_close

logger = logging.getLogger("cowrite.endpoint")
DOCUMENT_ID_RE = re.compile(DOCUMENT_ID_PATTERN)


class _Frame:
    """A received frame: text, or the reason it cannot be used."""

    __slots__ = ("binary", "text")

    def __init__(self, text: str | None, binary: bool) -> None:
        self.text = text
        self.binary = binary


async def _receive(ws: WebSocket) -> _Frame | None:
    message = await ws.receive()
    if message["type"] == "websocket.disconnect":
        return None
    text = message.get("text")
    if text is not None:
        return _Frame(text, False)
    return _Frame(None, True)


def _too_large(text: str, limit: int) -> bool:
    # A UTF-8 character is at most 4 bytes: short frames need no encoding.
    return len(text) * 4 > limit and len(text.encode()) > limit


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
    origin = ws.headers.get("origin")
    if settings.allowed_origins and origin is not None and origin not in settings.allowed_origins:
        logger.warning("refused origin %s", origin[:200], extra={"document_id": document_id})
        await ws.send_denial_response(PlainTextResponse("origin not allowed", status_code=403))
        return
    if not gate.enter():
        services.metrics.handshakes_refused.inc()
        await ws.send_denial_response(PlainTextResponse(
            "too many connections are still handshaking; retry shortly", status_code=503,
            headers={"Retry-After": "1"}))
        return
    try:
        offered = [p.strip() for p in ws.headers.get("sec-websocket-protocol", "").split(",")]
        await ws.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in offered else None)
    except BaseException:
        gate.leave()
        raise
    services.metrics.connections_open.inc()
    try:
        try:
            hello = await _read_hello(ws, services)
        finally:
            gate.leave()
        if hello is not None:
            await _serve(ws, services, document_id, hello)
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
        frame = await asyncio.wait_for(_receive(ws), settings.hello_timeout_s)
    except TimeoutError:
        await _refuse(ws, services, CloseCode.UNAUTHENTICATED, Error(
            code=ErrorCode.NOT_READY, message="no hello within the timeout"))
        return None
    if frame is None:
        return None
    if frame.text is None or _too_large(frame.text, settings.max_message_bytes):
        await _refuse(ws, services, CloseCode.UNAUTHENTICATED, Error(
            code=ErrorCode.INVALID_MESSAGE, message="the first frame must be a hello JSON text"))
        return None
    decoded = decode_frame(frame.text, settings.max_json_depth)
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
    header = ws.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


async def _serve(ws: WebSocket, services: Services, document_id: str, hello: Hello) -> None:
    try:
        principal = services.auth.verify(hello.token or _bearer(ws))
    except AuthError as exc:
        await _refuse(ws, services, CloseCode.UNAUTHENTICATED, Error(
            code=ErrorCode.INVALID_TOKEN, message=str(exc), reply_to=hello.id))
        return
    if not principal.may_open(document_id):
        await _refuse(ws, services, CloseCode.FORBIDDEN, Error(
            code=ErrorCode.FORBIDDEN, message="this token does not grant the document",
            reply_to=hello.id))
        return
    limit = services.settings.max_connections_per_user
    connection_id = uuid.uuid4().hex
    try:
        if not await services.backend.acquire_connection(principal.user_id, connection_id, limit):
            await _refuse(ws, services, CloseCode.RATE_LIMITED, Error(
                code=ErrorCode.RATE_LIMITED, message=f"at most {limit} connections per user",
                reply_to=hello.id, retry_after_ms=1000))
            return
        try:
            await _run_connection(ws, services, document_id, hello, principal, connection_id)
        finally:
            with contextlib.suppress(BackendUnavailable):
                await services.backend.release_connection(principal.user_id, connection_id)
    except BackendUnavailable as exc:
        logger.warning("backend unavailable at connect: %s", exc,
                       extra={"document_id": document_id})
        await _refuse(ws, services, CloseCode.INTERNAL_ERROR, Error(
            code=ErrorCode.UNAVAILABLE, message="the shared backend is unavailable; reconnect "
            "with backoff", reply_to=hello.id, retry_after_ms=1000))


async def _run_connection(
    ws: WebSocket, services: Services, document_id: str, hello: Hello, principal: Principal,
    connection_id: str,
) -> None:
    settings, metrics = services.settings, services.metrics
    session = services.hub.get(document_id)

    async def backfill(after: int, until: int) -> Any:
        head = await services.backend.head(document_id)
        result = await services.backend.read_after(document_id, head.epoch, after, until)
        return result if isinstance(result, list) else None

    outbound = Outbound(
        ws.send_text,
        max_events=settings.outbound_queue_max,
        max_bytes=settings.outbound_max_bytes,
        user_id=principal.user_id,
        backfill=backfill,
        on_sent=metrics.count_sent,
        on_idle=session.on_writer_idle,
    )
    conn = Connection(
        session_id=connection_id, document_id=document_id, client_id=hello.client_id,
        principal=principal, outbound=outbound, metrics=metrics,
    )
    conn.log_context = {
        "document_id": document_id, "user_id": principal.user_id, "connection_id": connection_id
    }
    try:
        await session.join(conn, hello)
        logger.info("connected client %s", hello.client_id[:64], extra=conn.log_context)
        expiry = ExpiryTimer(conn)
        reader = asyncio.create_task(_reader(ws, services, conn, expiry))
        writer = asyncio.create_task(outbound.run())
        try:
            done = await first_done(reader, writer)
        finally:
            expiry.cancel()
            reader.cancel()
            writer.cancel()
            await asyncio.gather(reader, writer, return_exceptions=True)
        for task in done:
            exc = None if task.cancelled() else task.exception()
            if exc is not None and not isinstance(exc, WebSocketDisconnect):
                logger.error("connection task failed", exc_info=exc, extra=conn.log_context)
                await _refuse(ws, services, CloseCode.INTERNAL_ERROR, None)
            elif outbound.close_request is not None:
                request = outbound.close_request
                metrics.closes.labels(str(request.code)).inc()
                await close_bounded(ws, request.code, request.reason, settings.close_timeout_s)
    finally:
        await session.detach(conn)
        services.hub.release(session)
        logger.info("disconnected", extra=conn.log_context)


async def _wait_for_writer() -> None:
    """After requesting a close: the writer flushes what is queued, then closes
    and ends the connection, which cancels this wait."""
    await asyncio.get_running_loop().create_future()


async def _reader(
    ws: WebSocket, services: Services, conn: Connection, expiry: ExpiryTimer
) -> None:
    settings, metrics = services.settings, services.metrics
    bucket = TokenBucket(settings.rate_messages_per_s, settings.rate_messages_per_s * 2)
    streak = InvalidStreak(settings.max_invalid_messages)
    session = services.hub.get(conn.document_id)
    while not cancel_requested():  # a cancel lost in a Redis write must still end it
        frame = await _receive(ws)
        if frame is None:
            return
        if frame.text is not None and _too_large(frame.text, settings.max_message_bytes):
            conn.error(ErrorCode.TOO_LARGE,
                       f"frame larger than {settings.max_message_bytes} bytes")
            conn.close(CloseCode.MESSAGE_TOO_BIG, "message too big")
            return await _wait_for_writer()
        decoded: dict[str, Any] | ParseFailure
        if frame.text is None:
            decoded = ParseFailure(ErrorCode.INVALID_MESSAGE, "binary frames are not accepted")
        else:
            decoded = decode_frame(frame.text, settings.max_json_depth)
        retry_after = bucket.take()
        if retry_after:
            conn.error(ErrorCode.RATE_LIMITED, "too many messages", retry_after_ms=retry_after,
                       reply_to=None if isinstance(decoded, ParseFailure)
                       else peek_reply_to(decoded))
            continue
        result = decoded if isinstance(decoded, ParseFailure) else validate_message(decoded)
        if isinstance(result, ParseFailure):
            metrics.messages_in.labels("invalid").inc()
            conn.error(result.code, result.message, reply_to=result.reply_to,
                       details=result.details)
            if streak.record_invalid():
                conn.close(CloseCode.TOO_MANY_INVALID, "too many invalid messages")
                return await _wait_for_writer()
            continue
        streak.record_valid()
        metrics.messages_in.labels(result.type).inc()
        await _dispatch(services, session, conn, result, expiry)


async def _dispatch(
    services: Services, session: Any, conn: Connection, message: ClientMessage,
    expiry: ExpiryTimer,
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
        expiry.arm()
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
