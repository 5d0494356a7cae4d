"""What a `welcome` describes: the server's limits and the runs a client joins (the
active one, with the calls it waits on, and the queued ones). Split from
protocol/server.py for size; everything here is re-exported there."""

from typing import Literal

from pydantic import Field

from protocol.base import JsonObject, WireModel

RunStatus = Literal[
    "queued", "running", "waiting_tool", "waiting_approval",
    "completed", "cancelled", "aborted", "failed", "timed_out",
]


class Limits(WireModel):
    """This server's limits, so a client can respect them up front."""

    max_message_bytes: int
    """Largest frame the server accepts (bigger: `too_large`, close 1009)."""
    tool_timeout_s: float
    """Seconds a client has to answer a `tool.call`."""
    run_timeout_s: float
    """Seconds a whole run may take."""
    max_steps: int
    """Model calls per run."""


class PendingItem(WireModel):
    """A tool call or approval the run is waiting for."""

    kind: Literal["tool", "approval"]
    """`tool`: a client tool call awaiting its result; `approval`: awaiting the user."""
    call_id: str
    """The call's id."""
    name: str
    """The tool's name."""
    arguments: JsonObject
    """The call's arguments."""
    token: str | None = None
    """The call's token (tool calls; only for the run's user)."""
    expires_at: int
    """Deadline, ms since the Unix epoch."""


class RunSnapshot(WireModel):
    """The state of the document's active run, to rebuild the UI after a reconnect."""

    run_id: str
    """The run's id."""
    status: RunStatus
    """`running`, `waiting_tool` or `waiting_approval` while active."""
    mode: Literal["agent", "chat"]
    """As in `run.start`."""
    user_id: str
    """Who started the run (only this user may approve or cancel)."""
    client_id: str
    """The run's executor: the tab that runs its client tools."""
    step: int
    """Model calls made so far."""
    pending: list[PendingItem] = Field(default_factory=list)
    """Tool calls and approvals the run is waiting for."""
