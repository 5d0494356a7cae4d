"""A connection on another instance, as the run engine sees it (`remote.py`)."""

from dataclasses import dataclass
from typing import Any, Protocol

from protocol.codes import ErrorCode
from protocol.server import Ack
from server.agent.wire_events import Message
from server.connection import error_event


class Poster(Protocol):
    """What a remote peer answers through: the router's `post` to an instance's inbox."""

    def post(self, instance_id: str, message: dict[str, Any]) -> None: ...


@dataclass(eq=False)
class RemotePeer:
    """A connection on another instance, answered through that instance's inbox."""

    router: Poster
    origin: str
    session_id: str
    document_id: str
    client_id: str
    remote_user_id: str

    @property
    def user_id(self) -> str:
        return self.remote_user_id

    def reply(self, message: Message) -> None:
        wire = message.to_wire()
        self.router.post(self.origin, {
            "kind": "reply", "connection": self.session_id, "document_id": self.document_id,
            "type": wire["type"], "frame": message.to_json().decode()})

    def error(self, code: ErrorCode, message: str, *, reply_to: str | None = None,
              run_id: str | None = None, details: Any = None,
              retry_after_ms: int | None = None) -> None:
        self.reply(error_event(code, message, reply_to=reply_to, run_id=run_id, details=details,
                               retry_after_ms=retry_after_ms))

    def ack(self, reply_to: str | None, **fields: Any) -> None:
        self.reply(Ack(reply_to=reply_to, **fields))
