"""The seams between the document session, the run engine and the outside.

Each Protocol names one concern (centrifuge's broker/presence split rather
than one big interface), so modules depend on what they use and never on
each other: the session knows a `RunHandler`, the run engine knows an
`EventLog`, a `RunRegistry`, a `ClusterLink` and a `Presence`. The memory
and Redis backends implement the registry and presence parts of `Backend`;
the session implements `EventLog`; `RunRegistry` is defined beside `Backend`
(server/backends/base.py) and re-exported here; `server.agent.remote.RunRouter` is the
cluster link.
"""

from collections.abc import Sequence
from typing import Any, Literal, Protocol

from protocol.base import WireModel
from protocol.client import ClientMessage, EditorChange
from protocol.server import FinishedStatus, RunSnapshot
from server.agent.wire_events import LoggedEventSource
from server.backends.base import RunRegistry
from server.connection import Peer
from server.log_groups import DecisionCheckpoint
from server.tools.catalog import ServerToolSpec, ToolInvocation
from server.tools.config import Workflow
from server.tools.context import ToolContext


class EventLog(Protocol):
    """The document's durable event log, as a run publishes to it."""

    remote: bool
    """Shared (Redis): an append's reply can be lost after it happened, so retries of a
    write carry its write ids (`log_groups.one_write`)."""

    async def publish_many(self, events: Sequence[LoggedEventSource],
                           checkpoint: DecisionCheckpoint | None = None) -> None:
        """Log `events` in order (with `checkpoint`, written in the same step). Raises
        `BackendUnavailable` or `UnloggableEvent` when the first event could not be
        logged (then none was), `LeaseNotHeld` when the checkpoint was refused."""
        ...

    async def publish_delta(self, run_id: str, message_id: str, delta: str) -> None: ...


class ClusterLink(Protocol):
    """Messages to the instance that owns a run."""

    def envelope(self, peer: Peer, message: WireModel) -> dict[str, Any]: ...

    async def to_run_owner(self, document_id: str, run_id: str, message: dict[str, Any],
                           peer: Peer | None = None) -> bool:
        """Bring `message` to whoever holds the active run `run_id` now or, after a
        takeover, next; False (nothing sent) when that run is not active."""
        ...

    def post_to_run_owner(self, document_id: str, run_id: str, message: dict[str, Any]
                          ) -> None: ...

    def has_lane(self, document_id: str) -> bool:
        """Whether this instance still forwards messages about the document."""
        ...

    def post(self, instance_id: str, message: dict[str, Any]) -> None: ...


class ServerTools(Protocol):
    """The operator's tools (built-in, Python, MCP): `server.tools.catalog.ToolCatalog`."""

    def specs(self) -> list[ServerToolSpec]: ...

    def check(self, name: str, arguments: dict[str, Any]) -> dict[str, Any] | str: ...

    async def invoke(self, name: str, arguments: dict[str, Any], ctx: ToolContext
                     ) -> ToolInvocation: ...

    def workflow(self, name: str) -> Workflow | None: ...


class LocalPresence(Protocol):
    """Whether a client of the document is connected to this instance."""

    def has_client(self, user_id: str, client_id: str) -> bool: ...


class RunHandler(Protocol):
    """What a document session asks of its run engine."""

    @property
    def busy(self) -> bool: ...

    async def handle(self, peer: Peer, message: ClientMessage, forwarded: bool = False
                     ) -> None: ...

    async def on_edit(self, peer: Peer, message: EditorChange, forwarded: bool = False
                      ) -> None: ...

    def drives(self, run_id: str) -> bool: ...

    async def snapshot(self, for_user: str | None = None) -> RunSnapshot | None: ...

    def presence_changed(self) -> None: ...

    def saw_run_end(self, run_id: str) -> None: ...

    async def queued(self) -> list[RunSnapshot]: ...

    async def start_queued(self) -> None: ...

    async def adopt(self, record: dict[str, Any], reason: Literal["owner_lost", "handoff"]
                    ) -> bool: ...

    async def abort(self, run_id: str, status: FinishedStatus, reason: str) -> None: ...

    async def shutdown(self) -> None: ...

    async def hand_over(self) -> None: ...


__all__ = ["ClusterLink", "EventLog", "LocalPresence", "RunHandler", "RunRegistry",
           "ServerTools"]
