"""What every adapter's HTTP edge shares: errors, the bearer JWT, bounded bodies.

Errors are `{"code", "message"}` (plus `details` / `retry_after_ms` when the
engine gave them) with the HTTP status of the cowrite error code, and never
carry exception text. A body is read up to `COWRITE_MAX_MESSAGE_BYTES` (more
is 413 `too_large`, without reading the rest) and decoded by the WebSocket
edge's own `decode_frame`, so the depth and 64-bit integer limits are the
same on both edges.
"""

import asyncio
import logging
import re
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from protocol.base import DOCUMENT_ID_PATTERN
from protocol.codes import ErrorCode
from protocol.parsing import ParseFailure, decode_frame
from protocol.server import Error
from server.agent.work import new_ref
from server.auth import AuthError, Principal
from server.services import Services

STATUS = {
    ErrorCode.INVALID_MESSAGE: 400, ErrorCode.UNKNOWN_TYPE: 400, ErrorCode.NOT_READY: 400,
    ErrorCode.INVALID_TOKEN: 403, ErrorCode.FORBIDDEN: 403, ErrorCode.RUN_NOT_FOUND: 404,
    ErrorCode.RUN_NOT_ACTIVE: 409, ErrorCode.CALL_NOT_PENDING: 409,
    ErrorCode.DOCUMENT_BUSY: 409, ErrorCode.TOO_LARGE: 413, ErrorCode.RATE_LIMITED: 429,
    ErrorCode.UNAVAILABLE: 503, ErrorCode.INTERNAL: 500,
}
DOCUMENT_ID = re.compile(DOCUMENT_ID_PATTERN)
logger = logging.getLogger("cowrite.http")


class HttpFailure(Exception):
    """An answer the edge gives instead of going on; `response()` renders it."""

    def __init__(self, code: ErrorCode, message: str, *, details: Any = None,
                 retry_after_ms: int | None = None, status: int | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.details = code, message, details
        self.retry_after_ms, self.status = retry_after_ms, status

    @classmethod
    def of(cls, error: Error) -> "HttpFailure":
        return cls(ErrorCode(error.code), error.message, details=error.details,
                   retry_after_ms=error.retry_after_ms)

    def response(self) -> Response:
        body: dict[str, Any] = {"code": self.code.value, "message": self.message}
        if self.details is not None:
            body["details"] = self.details
        headers: dict[str, str] = {}
        if self.retry_after_ms is not None:
            body["retry_after_ms"] = self.retry_after_ms
            headers["Retry-After"] = str(max(1, -(-self.retry_after_ms // 1000)))
        if self.status == 401:
            headers["WWW-Authenticate"] = 'Bearer realm="cowrite"'
        return Response(orjson.dumps(body), status_code=self.status or STATUS.get(self.code, 400),
                        media_type="application/json", headers=headers)


def json_response(data: Any, status_code: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status_code, media_type="application/json")


def check_document(document_id: str) -> None:
    if not DOCUMENT_ID.fullmatch(document_id):
        raise HttpFailure(ErrorCode.RUN_NOT_FOUND, "unknown document", status=404)


def principal_for(services: Services, token: str | None, document_id: str,
                  *, write: bool = True) -> Principal:
    """The caller, allowed to write to `document_id`; 401 without a good JWT."""
    try:
        principal = services.auth.verify(token)
    except AuthError as exc:
        raise HttpFailure(ErrorCode.INVALID_TOKEN, str(exc), status=401) from exc
    if not principal.may_open(document_id):
        raise HttpFailure(ErrorCode.FORBIDDEN, "this token does not grant the document")
    if write and principal.role == "viewer":
        raise HttpFailure(ErrorCode.FORBIDDEN, "viewers may not run or answer the agent")
    return principal


BODY_TIMEOUT_S = 30.0
"""How long a request body may take to arrive (a megabyte needs well under a second)."""


def bearer_token(request: Request) -> str | None:
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


async def read_object(request: Request, services: Services) -> dict[str, Any]:
    """The request's JSON object, within the size and depth limits of the WebSocket edge."""
    limit = services.settings.max_message_bytes
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise HttpFailure(ErrorCode.TOO_LARGE, f"body larger than {limit} bytes")
    body = bytearray()
    try:
        async with asyncio.timeout(BODY_TIMEOUT_S):  # a body trickled in held its socket
            async for chunk in request.stream():
                body += chunk
                if len(body) > limit:
                    raise HttpFailure(ErrorCode.TOO_LARGE, f"body larger than {limit} bytes")
    except TimeoutError:
        raise HttpFailure(ErrorCode.INVALID_MESSAGE, f"body not received within "
                          f"{BODY_TIMEOUT_S:g} s", status=408) from None
    decoded = decode_frame(bytes(body), services.settings.max_json_depth, "body")
    if isinstance(decoded, ParseFailure):
        raise HttpFailure(decoded.code, decoded.message, details=decoded.details)
    return decoded


async def internal_error(request: Request, exc: Exception) -> Response:
    """Starlette's handler for anything an HTTP route did not expect: the JSON error
    every other answer has (500 `internal`, a ref instead of the exception's text),
    where Starlette would answer a plain-text "Internal Server Error". The server logs
    the traceback after this line (Starlette re-raises); the ref ties the two."""
    ref = new_ref()
    logger.error("unexpected error answering %s %s (ref %s): %s", request.method,
                 request.url.path, ref, type(exc).__name__)
    response = HttpFailure(ErrorCode.INTERNAL, f"internal error (ref {ref})",
                           status=500).response()
    # Answered outside the CORS middleware: its headers here, or a page on another
    # origin reads "Failed to fetch" (the AI SDK: a disconnect) instead of this error.
    origin = request.headers.get("origin")
    settings = request.app.state.services.settings
    if origin is not None and settings.origin_allowed(origin):
        response.headers["access-control-allow-origin"] = \
            "*" if not settings.allowed_origins else origin
        response.headers["vary"] = "Origin"
    return response
