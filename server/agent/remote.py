"""Runs owned by another instance (Redis backend).

The instance running a run's agent loop owns it and renews a lease. A
message about that run arriving elsewhere is forwarded to the owner's inbox
(a Redis stream: durable, ordered), handled there as if its sender were
local (`RemotePeer`), and the owner's `ack`/`error` travel back through the
sender's instance inbox. Every instance also runs a janitor: a run whose
lease lapsed (its owner died) is taken by exactly one survivor, which logs
`tool.done cancelled` for its pending calls and `run.finished`
`aborted`/`server_lost`.
"""

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from protocol.base import WireModel
from protocol.client import ParseFailure, validate_message
from protocol.codes import ErrorCode
from protocol.server import Ack, RunFinished, ToolDone
from server.backends.base import BackendUnavailable
from server.connection import Peer, error_event

if TYPE_CHECKING:
    from server.services import Services

logger = logging.getLogger("cowrite.remote")


@dataclass(eq=False)
class RemotePeer:
    """A connection on another instance, answered through that instance's inbox."""

    router: "RunRouter"
    origin: str
    session_id: str
    document_id: str
    client_id: str
    remote_user_id: str

    @property
    def user_id(self) -> str:
        return self.remote_user_id

    def reply(self, message: WireModel) -> None:
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


class RunRouter:
    def __init__(self, services: "Services") -> None:
        self.services = services
        self.me = services.instance_id
        self._tasks: list[asyncio.Task[None]] = []
        self._posts: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._tasks = [asyncio.create_task(self._inbox_loop()),
                       asyncio.create_task(self._janitor_loop())]

    async def stop(self) -> None:
        for task in self._tasks + list(self._posts):
            task.cancel()
        await asyncio.gather(*self._tasks, *self._posts, return_exceptions=True)

    async def forward(self, owner: str, peer: Peer, message: WireModel) -> None:
        await self.services.backend.send(owner, {
            "kind": "message", "document_id": peer.document_id, "origin": self.me,
            "connection": peer.session_id, "user_id": peer.user_id,
            "client_id": peer.client_id, "message": message.to_wire()})

    def post(self, instance_id: str, message: dict[str, Any]) -> None:
        """Send without waiting (replies are ephemeral; a lost one is retried by the client)."""
        task = asyncio.get_running_loop().create_task(self._post(instance_id, message))
        self._posts.add(task)
        task.add_done_callback(self._posts.discard)

    async def _post(self, instance_id: str, message: dict[str, Any]) -> None:
        with contextlib.suppress(BackendUnavailable):
            await self.services.backend.send(instance_id, message)

    async def _inbox_loop(self) -> None:
        async for message in self.services.backend.inbox(self.me):
            try:
                await self._dispatch(message)
            except Exception:
                logger.exception("inbox message failed: %s", message.get("kind"))

    async def _dispatch(self, message: dict[str, Any]) -> None:
        kind, document_id = message.get("kind"), str(message.get("document_id", ""))
        hub = self.services.hub
        if kind == "reply":
            session = hub.sessions.get(document_id)
            conn = session.connections.get(message["connection"]) if session else None
            if conn is not None:
                conn.outbound.push_frame(message["type"], message["frame"])
            return
        session = hub.get(document_id)
        try:
            if kind == "message":
                parsed = validate_message(message["message"])
                if isinstance(parsed, ParseFailure):
                    return
                peer = RemotePeer(self, message["origin"], message["connection"], document_id,
                                  message["client_id"], message["user_id"])
                await session.runs.handle(peer, parsed, forwarded=True)
            elif kind == "abort":
                await session.runs.abort(message["run_id"], "aborted", "document_changed")
            elif kind == "supersede":
                await session.runs.abort(message["run_id"], "cancelled", "superseded")
        finally:
            hub.release(session)

    async def _janitor_loop(self) -> None:
        interval = max(0.05, self.services.settings.run_lease_s / 4)
        while True:
            await asyncio.sleep(interval)
            try:
                for document_id, record in await self.services.backend.expired_runs():
                    await self._announce_lost(document_id, record)
            except BackendUnavailable:
                continue
            except Exception:
                logger.exception("announcing a lost run failed")

    async def _announce_lost(self, document_id: str, record: dict[str, Any]) -> None:
        backend, run_id = self.services.backend, str(record["run_id"])
        logger.warning("run %s lost its owner %s", run_id, record.get("owner"),
                       extra={"document_id": document_id, "run_id": run_id})
        for item in record.get("pending", []):
            await backend.append(document_id, ToolDone(
                run_id=run_id, call_id=item["call_id"], status="cancelled",
                error={"message": "the instance running this run was lost"}).to_wire())
        await backend.append(document_id, RunFinished(
            run_id=run_id, status="aborted", reason="server_lost",
            steps=int(record.get("step", 0))).to_wire())
        await backend.put_run_record(document_id, run_id, {
            "status": "aborted", "user_id": record.get("user_id"),
            "client_id": record.get("client_id")})
        self.services.metrics.runs.labels("aborted").inc()
