"""Run ownership for one document session (placeholder until agent runs land)."""

from typing import TYPE_CHECKING

from protocol.client import ClientMessage, RunStart
from protocol.codes import ErrorCode
from protocol.server import RunSnapshot
from server.connection import Connection

if TYPE_CHECKING:
    from server.services import Services
    from server.session import DocumentSession


class RunCoordinator:
    def __init__(self, session: "DocumentSession", services: "Services") -> None:
        self.session = session
        self.services = services

    @property
    def busy(self) -> bool:
        return False

    def snapshot(self) -> RunSnapshot | None:
        return None

    def on_connection_joined(self, conn: Connection) -> None:
        return None

    def on_connection_left(self, conn: Connection) -> None:
        return None

    async def on_user_edit(self, conn: Connection) -> None:
        return None

    async def shutdown(self) -> None:
        return None

    async def handle(self, conn: Connection, message: ClientMessage) -> None:
        if isinstance(message, RunStart):
            conn.error(ErrorCode.INTERNAL, "agent runs are not available yet", reply_to=message.id)
            return
        conn.error(ErrorCode.RUN_NOT_FOUND, "no such run", reply_to=message.id)
