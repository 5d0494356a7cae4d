"""`GET /v1/ai-sdk/{document_id}/ws`: the AI SDK 7 `WebSocketChatTransport` protocol.

Client frames: `send` (the chat request of `POST .../chat`, its JWT in
`headers.authorization` or the connection's `token` query parameter),
`resume` (replays the chat's active run from its start, skipping up to
`lastSequence`, or its last run when the SSE reconnect would replay it;
`no-active` when there is none; without `lastSequence`, what
the transport sends, the replay is the SSE reconnect's: no answered call
asked again, no discarded text) and `abort` (stops the request's stream; a
`send`'s also cancels its run, a `resume`'s does not).
Server frames: `start`, `chunk` (`sequence` from 0 per request), `end`,
`error` (`errorText`), `no-active`.
Each request streams in its own task; frames are written one at a time.
Bad frames get `error` for their request (or are dropped when they name
none; a frame refused by the JSON limits, too deep or with an integer beyond
64 bits, is answered for the `requestId` it holds); the socket stays open.
At most `MAX_IN_FLIGHT` requests stream at once on one socket (the transport
has one per chat it serves); one more is an `error` (`rate_limited`), not a
task.
A socket is one user's, like the document socket: its first request with a good
token takes one of that user's `COWRITE_MAX_CONNECTIONS_PER_USER` slots, for as long
as the socket lives (over the cap: `error` `rate_limited`, then close 4008); a
request with another user's token is refused (`forbidden`), the socket stays.
"""

import asyncio
import contextlib
import logging
import re
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
from starlette.responses import PlainTextResponse
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from protocol.codes import CloseCode, ErrorCode
from protocol.parsing import ParseFailure, decode_frame
from server.adapters.ai_sdk import (
    CHAT_ID,
    Segment,
    open_segment,
    parse_request,
    reconnected,
)
from server.adapters.ai_sdk_chunks import Chunk
from server.adapters.chat import ChatRun, ChatRuns
from server.adapters.http import DOCUMENT_ID, HttpFailure, principal_for
from server.agent.work import new_ref
from server.auth import Principal
from server.backends.base import BackendUnavailable
from server.limits import HandshakeGate, InvalidStreak, TokenBucket
from server.services import Services
from server.transport import closer

logger = logging.getLogger("cowrite.adapters")
MAX_IN_FLIGHT = 32


class _Socket:
    def __init__(self, ws: WebSocket, services: Services, runs: ChatRuns, document_id: str
                 ) -> None:
        self.ws, self.services, self.runs, self.document_id = ws, services, runs, document_id
        self.lock = asyncio.Lock()
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.request_runs: dict[str, ChatRun[Chunk]] = {}
        self.aborted: set[str] = set()  # requests aborted before their run was known
        self.viewing: set[str] = set()  # requests of a viewer: an abort stops the stream only
        self.authenticated = False  # a request with a good token was made on it
        self.on_authenticated: Callable[[], None] = lambda: None
        self.slot: tuple[str, str] | None = None  # (user id, connection id): whose it is

    async def write(self, frame: dict[str, Any]) -> None:
        async with self.lock:
            await self.ws.send_text(orjson.dumps(frame).decode())

    def _token(self, frame: dict[str, Any]) -> str | None:
        headers = frame.get("headers")
        if isinstance(headers, dict):
            value = str(headers.get("authorization") or headers.get("Authorization") or "")
            scheme, _, token = value.partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
        return self.ws.query_params.get("token")

    async def serve(self) -> None:
        """Requests until the peer goes. Like the document socket, a socket must make an
        authenticated request within `COWRITE_HELLO_TIMEOUT_S` of its upgrade (4001),
        counts against the handshake cap until it has, and meets the per-connection
        message rate and invalid-frame limits (4400): sockets with no token were held
        for ever, and their frames (1 MB each) parsed and dropped without limit."""
        settings = self.services.settings
        limit = settings.max_message_bytes
        # One deadline from the upgrade: each read had its own, so a frame every few
        # seconds (an abort, a bad token) held the socket and its handshake slot for ever.
        deadline = asyncio.get_running_loop().time() + settings.hello_timeout_s
        bucket = TokenBucket(settings.rate_messages_per_s, settings.rate_messages_per_s * 2)
        streak = InvalidStreak(settings.max_invalid_messages)
        while True:
            if self.authenticated:
                message = await self.ws.receive()
            else:  # a deadline only until a request with a good token
                try:
                    async with asyncio.timeout_at(deadline):
                        message = await self.ws.receive()
                except TimeoutError:
                    await self.ws.close(4001, "no authenticated request in time")
                    return
            if message["type"] == "websocket.disconnect":
                return
            text = message.get("text")
            oversized = text is not None and len(text.encode()) > limit
            frame = decode_frame(text, settings.max_json_depth) \
                if text is not None and not oversized else None
            request_id = frame.get("requestId") if isinstance(frame, dict) else None
            if not isinstance(frame, dict) or not isinstance(request_id, str) or \
                    not 0 < len(request_id) <= 128:
                if streak.record_invalid():
                    await self.ws.close(4400, "too many invalid frames in a row")
                    return
                failure = frame if isinstance(frame, ParseFailure) else None
                refused = _request_id_in(text) if failure is not None or oversized else None
                if refused is not None:
                    # Refused by the size or JSON limits (a chat's whole history over
                    # COWRITE_MAX_MESSAGE_BYTES; too deep, an integer beyond 64 bits: a
                    # tool's output can hold either): answered, or the transport waited
                    # for ever. Frames with no request id to answer are dropped:
                    # WebSocketChatTransport never sends those.
                    why = f"{failure.code.value}: {failure.message}" if failure is not None \
                        else f"too_large: frame larger than {limit} bytes"
                    await self.write({"type": "error", "requestId": refused, "errorText":
                                      "rate_limited: too many messages on this socket"
                                      if bucket.take() else why})
                continue
            streak.record_valid()
            if bucket.take():
                await self.write({"type": "error", "requestId": request_id, "errorText":
                                  "rate_limited: too many messages on this socket"})
                continue
            kind = frame.get("type")
            if kind == "abort":
                await self._abort(request_id)
            elif kind in ("send", "resume"):
                if request_id in self.tasks:
                    await self.write({"type": "error", "requestId": request_id, "errorText":
                                      "invalid_message: this requestId is still streaming"})
                    continue
                if len(self.tasks) >= MAX_IN_FLIGHT:
                    await self.write({"type": "error", "requestId": request_id, "errorText":
                                      f"rate_limited: at most {MAX_IN_FLIGHT} requests in "
                                      "flight on one socket"})
                    continue
                principal = await self._admit(request_id, frame)
                if principal is None:
                    if self.ws.application_state is WebSocketState.CONNECTED:
                        continue
                    return  # closed 4008
                task = asyncio.get_running_loop().create_task(
                    self._request(request_id, frame, principal))
                self.tasks[request_id] = task
                task.add_done_callback(self._forget(request_id))
            else:
                await self.write({"type": "error", "requestId": request_id,
                                  "errorText": f"unknown frame type {str(kind)[:64]!r}"})

    def _forget(self, request_id: str) -> "Callable[[asyncio.Task[None]], None]":
        def done(task: "asyncio.Task[None]") -> None:
            if self.tasks.get(request_id) is task:
                del self.tasks[request_id]
            self.aborted.discard(request_id)
        return done

    async def _admit(self, request_id: str, frame: dict[str, Any]) -> Principal | None:
        """The request's caller, or None once its `error` is written. The first good
        token takes a slot of its user's connections (section 6a), held until the socket
        ends (these sockets were not counted: a user capped at 2 document sockets kept 20
        of them open); over the cap the socket is closed 4008, like a document socket
        refused at its hello. Taken here, before the request's task, so that two first
        requests cannot both take one. A socket is its first user's: another user's
        token is refused (each frame carries its own token, and one socket counting for
        several users, or for none of them, would let the cap be sidestepped)."""
        try:
            principal = principal_for(self.services, self._token(frame), self.document_id,
                                      write=frame["type"] == "send")
            if self.slot is None:
                limit = self.services.settings.max_connections_per_user
                slot = (principal.user_id, uuid.uuid4().hex)
                if not await self.services.backend.acquire_connection(*slot, limit):
                    why = f"at most {limit} connections per user"
                    await self.write({"type": "error", "requestId": request_id,
                                      "errorText": f"rate_limited: {why}"})
                    await self.ws.close(int(CloseCode.RATE_LIMITED), why)
                    return None
                self.slot, self.authenticated = slot, True
                self.on_authenticated()
            elif principal.user_id != self.slot[0]:
                raise HttpFailure(ErrorCode.FORBIDDEN, "this socket belongs to the user of "
                                  "its first request; open another one for this user")
            return principal
        except HttpFailure as failure:
            answer = f"{failure.code.value}: {failure.message}"
        except BackendUnavailable:  # no slot taken: the next request tries again
            answer = "unavailable: the shared backend is unavailable"
        await self.write({"type": "error", "requestId": request_id, "errorText": answer})
        return None

    async def _request(self, request_id: str, frame: dict[str, Any], principal: Principal
                       ) -> None:
        try:
            # Their abort stops their own stream only: a viewer's cancelled the run it
            # followed, and so did a resume's (the AI SDK aborts a resume that a newer one
            # replaces: a remount, React StrictMode's second effect, a retry).
            if principal.role == "viewer" or frame["type"] == "resume":
                self.viewing.add(request_id)
            if frame["type"] == "send":
                given = frame.get("body")
                body: dict[str, Any] = given if isinstance(given, dict) else {}
                chat = parse_request({**body, **{k: frame[k] for k in (
                    "id", "messages", "trigger", "messageId") if k in frame}})
                segment = await open_segment(self.services, self.runs, self.document_id,
                                             principal, chat)
                skip = 0
            else:
                chat_id = str(frame.get("id", ""))
                found = await reconnected(self.runs, self.document_id, chat_id, principal) \
                    if re.fullmatch(CHAT_ID, chat_id) else None
                if found is None:
                    await self.write({"type": "no-active", "requestId": request_id})
                    return
                last = frame.get("lastSequence")
                skip = last + 1 if isinstance(last, int) and last >= 0 else 0
                # A whole replay is renumbered from 0 (gapless): it may leave chunks out.
                segment = Segment(found, 0, replay=not skip)
            run = segment.run
            if request_id in self.aborted:  # aborted while the run started: it ends now
                if not run.finished and request_id not in self.viewing:
                    await run.cancel()
                return
            self.request_runs[request_id] = run
            await self.write({"type": "start", "requestId": request_id})
            chunks = segment.with_resets(True).chunks()  # `ai` 7 (ai_sdk_chunks)
            await self._pump(request_id, chunks, skip)
            await self.write({"type": "end", "requestId": request_id})
        except HttpFailure as failure:
            await self.write({"type": "error", "requestId": request_id,
                              "errorText": f"{failure.code.value}: {failure.message}"})
        except BackendUnavailable:
            await self.write({"type": "error", "requestId": request_id,
                              "errorText": "unavailable: the shared backend is unavailable"})
        except WebSocketDisconnect:
            return  # the socket went away mid-answer: nobody to tell
        except Exception:  # a bug: the request learns it failed, not why
            if self.ws.application_state is not WebSocketState.CONNECTED:
                return
            ref = new_ref()
            logger.exception("AI SDK WebSocket request failed (ref %s)", ref)
            with contextlib.suppress(Exception):
                await self.write({"type": "error", "requestId": request_id,
                                  "errorText": f"internal: internal error (ref {ref})"})
        finally:
            self.request_runs.pop(request_id, None)
            self.viewing.discard(request_id)

    async def _pump(self, request_id: str, chunks: AsyncIterator[Chunk], skip: int) -> None:
        sequence = 0
        async for chunk in chunks:
            if sequence >= skip:
                await self.write({"type": "chunk", "requestId": request_id,
                                  "sequence": sequence - skip, "chunk": chunk})
            sequence += 1

    async def _abort(self, request_id: str) -> None:
        """The transport's abort signal: stop the stream and cancel the run. A request
        still starting its run (or finding it) is not cancelled midway, which would
        leave a run going that nobody follows: it cancels the run once it has it."""
        run = self.request_runs.pop(request_id, None)
        task = self.tasks.get(request_id)
        if run is None:
            if task is not None:
                self.aborted.add(request_id)
            return
        if task is not None:
            task.cancel()
        if not run.finished and request_id not in self.viewing:
            await run.cancel()

    async def close(self) -> None:
        for task in list(self.tasks.values()):
            task.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)


def _request_id_in(text: str | None) -> str | None:
    """The `requestId` of a frame `decode_frame` refused, when it is JSON that has one
    (nested too deep or holding an integer beyond 64 bits; orjson's own depth limit,
    1024, or broken JSON: none)."""
    try:
        data = orjson.loads(text) if text is not None else None
    except orjson.JSONDecodeError:
        return None
    request_id = data.get("requestId") if isinstance(data, dict) else None
    return request_id if isinstance(request_id, str) and 0 < len(request_id) <= 128 else None


async def ai_sdk_socket(ws: WebSocket) -> None:
    services: Services = ws.app.state.services
    document_id: str = ws.path_params["document_id"]
    if not DOCUMENT_ID.fullmatch(document_id):
        await ws.send_denial_response(PlainTextResponse("unknown document", status_code=404))
        return
    origin = ws.headers.get("origin")
    if origin is not None and not services.settings.origin_allowed(origin):
        await ws.send_denial_response(PlainTextResponse("origin not allowed", status_code=403))
        return
    gate: HandshakeGate = ws.app.state.handshakes

    ticket = gate.enter(closer(ws.scope, services.metrics.handshakes_refused.inc))

    def authenticated() -> None:
        gate.leave(ticket)

    socket = _Socket(ws, services, ws.app.state.chat_runs, document_id)
    socket.on_authenticated = authenticated
    try:
        await ws.accept()
        await socket.serve()
    except WebSocketDisconnect:
        pass
    finally:
        authenticated()
        try:
            await socket.close()
            with contextlib.suppress(Exception):
                await ws.close()
        finally:
            if socket.slot is not None:  # after its requests: they used it till now
                with contextlib.suppress(BackendUnavailable):
                    await services.backend.release_connection(*socket.slot)

