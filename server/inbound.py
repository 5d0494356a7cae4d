"""A client's frames checked at the edge, before anything routes them.

Size first (`COWRITE_MAX_MESSAGE_BYTES`, without encoding short frames),
then JSON nesting depth and 64-bit integers (`decode_frame`), the message
rate, then the schema. A refused frame is answered on the connection
(`too_large`, `rate_limited`, `invalid_message`...) and never reaches the
session; too large a frame, or the 4400 streak of invalid ones, closes the
connection. No I/O here: errors and closes are queued on the connection.
"""

from typing import Any

from protocol.client import ClientMessage
from protocol.codes import CloseCode, ErrorCode
from protocol.parsing import ParseFailure, decode_frame, peek_reply_to, validate_message
from server.connection import Connection
from server.limits import InvalidStreak, TokenBucket
from server.services import Services


def too_large(text: str, limit: int) -> bool:
    # A UTF-8 character is at most 4 bytes: short frames need no encoding.
    return len(text) * 4 > limit and len(text.encode()) > limit


class Closing:
    """`admit`'s answer when the frame made the connection close."""


CLOSING = Closing()


def admit(text: str | None, services: Services, conn: Connection, bucket: TokenBucket,
          streak: InvalidStreak) -> ClientMessage | Closing | None:
    """A frame's text (None: a binary frame) as a message to route; else None
    once it was answered with an error, or `CLOSING` once a close was
    requested (too large, 4400 streak)."""
    settings, metrics = services.settings, services.metrics
    if text is not None and too_large(text, settings.max_message_bytes):
        conn.error(ErrorCode.TOO_LARGE, f"frame larger than {settings.max_message_bytes} bytes")
        conn.close(CloseCode.MESSAGE_TOO_BIG, "message too big")
        return CLOSING
    decoded: dict[str, Any] | ParseFailure
    if text is None:
        decoded = ParseFailure(ErrorCode.INVALID_MESSAGE, "binary frames are not accepted")
    else:
        decoded = decode_frame(text, settings.max_json_depth)
    retry_after = bucket.take()
    if retry_after:
        conn.error(ErrorCode.RATE_LIMITED, "too many messages", retry_after_ms=retry_after,
                   reply_to=None if isinstance(decoded, ParseFailure)
                   else peek_reply_to(decoded))
        return None
    result = decoded if isinstance(decoded, ParseFailure) else validate_message(decoded)
    if isinstance(result, ParseFailure):
        metrics.messages_in.labels("invalid").inc()
        conn.error(result.code, result.message, reply_to=result.reply_to,
                   details=result.details)
        if streak.record_invalid():
            conn.close(CloseCode.TOO_MANY_INVALID, "too many invalid messages")
            return CLOSING
        return None
    streak.record_valid()
    metrics.count_received(result.type)
    return result
