"""Error and close codes (PROTOCOL.md section 7), defined once.

Every error the server sends uses an `ErrorCode`; every close uses a
`CloseCode`. Clients decide whether to reconnect from `CloseCode.retryable`,
so that decision lives next to the codes instead of in each client.
"""

from enum import IntEnum, StrEnum


class ErrorCode(StrEnum):
    INVALID_MESSAGE = "invalid_message"
    UNKNOWN_TYPE = "unknown_type"
    NOT_READY = "not_ready"
    FORBIDDEN = "forbidden"
    DOCUMENT_BUSY = "document_busy"
    RUN_NOT_FOUND = "run_not_found"
    RUN_NOT_ACTIVE = "run_not_active"
    CALL_NOT_PENDING = "call_not_pending"
    INVALID_TOKEN = "invalid_token"
    RATE_LIMITED = "rate_limited"
    TOO_LARGE = "too_large"
    UNAVAILABLE = "unavailable"
    INTERNAL = "internal"


class CloseCode(IntEnum):
    NORMAL = 1000
    GOING_AWAY = 1001
    MESSAGE_TOO_BIG = 1009
    INTERNAL_ERROR = 1011
    UNAUTHENTICATED = 4001
    FORBIDDEN = 4003
    RATE_LIMITED = 4008
    SLOW_CONSUMER = 4009
    TOO_MANY_INVALID = 4400

    @property
    def retryable(self) -> bool:
        """Whether a client should reconnect (and resume) after this close."""
        return self in _RETRYABLE


_RETRYABLE = frozenset(
    {
        CloseCode.GOING_AWAY,
        CloseCode.INTERNAL_ERROR,
        CloseCode.RATE_LIMITED,
        CloseCode.SLOW_CONSUMER,
    }
)
