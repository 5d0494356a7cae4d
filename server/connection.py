"""One client connection as the session sees it: identity plus an outbox.

The session never touches a socket: it calls `reply`, `error` or `ack`,
which queue frames on the connection's `Outbound` writer.
"""

from dataclasses import dataclass, field
from typing import Any, Protocol

from protocol.codes import CloseCode, ErrorCode
from protocol.server import Ack, Error
from server.agent.wire_events import Message
from server.auth import Principal
from server.observability import Metrics
from server.outbound import CloseRequest, Outbound


class Peer(Protocol):
    """Whoever sent a message about a run: a local `Connection`, or a
    connection on another instance (`server.agent.remote_peer.RemotePeer`)."""

    session_id: str
    document_id: str
    client_id: str

    @property
    def user_id(self) -> str: ...

    def reply(self, message: Message) -> None: ...

    def error(self, code: ErrorCode, message: str, *, reply_to: str | None = None,
              run_id: str | None = None, details: Any = None,
              retry_after_ms: int | None = None) -> None: ...

    def ack(self, reply_to: str | None, **fields: Any) -> None: ...


def error_event(code: ErrorCode, message: str, *, reply_to: str | None = None,
                run_id: str | None = None, details: Any = None,
                retry_after_ms: int | None = None) -> Error:
    return Error(code=code.value, message=message, reply_to=reply_to, run_id=run_id,
                 details=details, retry_after_ms=retry_after_ms)


@dataclass(eq=False, slots=True)
class Connection:
    session_id: str
    document_id: str
    client_id: str
    principal: Principal
    outbound: Outbound
    metrics: Metrics
    log_context: dict[str, Any] = field(default_factory=dict)
    expiry_second: int | None = None  # the `ExpiryWheel` bucket holding it, if any
    epoch: str = ""  # the log's epoch its welcome named (see `DocumentSession._log_reset`)

    @property
    def user_id(self) -> str:
        return self.principal.user_id

    @property
    def is_viewer(self) -> bool:
        return self.principal.role == "viewer"

    def reply(self, message: Message) -> None:
        # Every server message has a `type` field (a literal default): read it,
        # rather than dumping the model a second time to find it.
        if isinstance(message, Error):  # counted here: the run engine makes its own errors
            self.metrics.errors.labels(ErrorCode(message.code).value).inc()
        self.outbound.push_frame(str(message.type),  # type: ignore[union-attr]
                                 message.to_json().decode())

    def error(
        self,
        code: ErrorCode,
        message: str,
        *,
        reply_to: str | None = None,
        run_id: str | None = None,
        details: Any = None,
        retry_after_ms: int | None = None,
    ) -> None:
        self.reply(error_event(code, message, reply_to=reply_to, run_id=run_id, details=details,
                               retry_after_ms=retry_after_ms))

    def ack(self, reply_to: str | None, **fields: Any) -> None:
        self.reply(Ack(reply_to=reply_to, **fields))

    def close(self, code: CloseCode, reason: str, *, drop_pending: bool = False) -> None:
        self.outbound.close(CloseRequest(int(code), reason), drop_pending=drop_pending)
