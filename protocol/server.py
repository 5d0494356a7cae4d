"""Server -> client events (PROTOCOL.md section 5).

Ephemeral events (`welcome`, `ack`, `error`, `pong`) go to one connection and
carry no `seq`. Durable events are built without `seq`/`ts`: the backend
stamps both when it appends the event to the document log, so the numbering
has exactly one owner.
"""

from typing import Annotated, Any, Literal

from pydantic import Field, TypeAdapter

from protocol.base import JsonObject, NonNegativeInt, WireModel
from protocol.codes import ErrorCode

RunStatus = Literal[
    "running", "waiting_tool", "waiting_approval",
    "completed", "cancelled", "aborted", "failed", "timed_out",
]
FinishedStatus = Literal["completed", "cancelled", "aborted", "failed", "timed_out"]
ToolDoneStatus = Literal["ok", "error", "rejected", "timeout", "cancelled"]
Role = Literal["editor", "viewer"]


class Limits(WireModel):
    max_message_bytes: int
    tool_timeout_s: float
    run_timeout_s: float
    max_steps: int


class PendingItem(WireModel):
    kind: Literal["tool", "approval"]
    call_id: str
    name: str
    arguments: JsonObject
    token: str | None = None
    expires_at: int


class RunSnapshot(WireModel):
    run_id: str
    status: RunStatus
    mode: Literal["agent", "chat"]
    user_id: str
    client_id: str
    step: int
    pending: list[PendingItem] = Field(default_factory=list)


class Welcome(WireModel):
    type: Literal["welcome"] = "welcome"
    protocol: int
    session_id: str
    document_id: str
    user_id: str
    client_id: str
    role: Role
    epoch: str
    last_seq: NonNegativeInt
    resumed: bool
    resume_failed: Literal["epoch_changed", "history_truncated"] | None = None
    replayed: NonNegativeInt = 0
    active_run: RunSnapshot | None = None
    limits: Limits


class Ack(WireModel):
    type: Literal["ack"] = "ack"
    reply_to: str | None = None
    run_id: str | None = None
    call_id: str | None = None
    duplicate: bool | None = None
    status: str | None = None


class Error(WireModel):
    type: Literal["error"] = "error"
    code: ErrorCode
    message: str
    reply_to: str | None = None
    run_id: str | None = None
    details: Any = None
    retry_after_ms: int | None = None


class Pong(WireModel):
    type: Literal["pong"] = "pong"
    ts: int | float | None = None


class DurableEvent(WireModel):
    """Base of logged events; `seq` and `ts` are stamped by the backend."""

    seq: int | None = None
    ts: int | None = None


class RunStarted(DurableEvent):
    type: Literal["run.started"] = "run.started"
    run_id: str
    mode: Literal["agent", "chat"]
    user_id: str
    client_id: str
    prompt: str


class MessageDelta(DurableEvent):
    type: Literal["message.delta"] = "message.delta"
    run_id: str
    message_id: str
    delta: str


class MessageDone(DurableEvent):
    type: Literal["message.done"] = "message.done"
    run_id: str
    message_id: str
    text: str


class ToolCall(DurableEvent):
    type: Literal["tool.call"] = "tool.call"
    run_id: str
    call_id: str
    name: str
    arguments: JsonObject
    executor: Literal["client", "server"]
    client_id: str | None = None
    token: str | None = None
    expires_at: int | None = None


class ApprovalRequested(DurableEvent):
    type: Literal["approval.requested"] = "approval.requested"
    run_id: str
    call_id: str
    name: str
    arguments: JsonObject
    expires_at: int


class ApprovalResolved(DurableEvent):
    type: Literal["approval.resolved"] = "approval.resolved"
    run_id: str
    call_id: str
    decision: Literal["approve", "reject"]
    user_id: str


class ToolDone(DurableEvent):
    type: Literal["tool.done"] = "tool.done"
    run_id: str
    call_id: str
    status: ToolDoneStatus
    output: Any = None
    error: JsonObject | None = None


class RunError(WireModel):
    code: str
    message: str
    details: JsonObject | None = None  # upstream failures: {"kind", "status"?}


class RunFinished(DurableEvent):
    type: Literal["run.finished"] = "run.finished"
    run_id: str
    status: FinishedStatus
    reason: str | None = None
    error: RunError | None = None
    steps: int
    usage: JsonObject | None = None


class DocumentChanged(DurableEvent):
    type: Literal["document.changed"] = "document.changed"
    document_version: int | str | None = None
    user_id: str
    client_id: str
    origin: Literal["user", "agent"]


ServerEvent = Annotated[
    Welcome | Ack | Error | Pong | RunStarted | MessageDelta | MessageDone | ToolCall
    | ApprovalRequested | ApprovalResolved | ToolDone | RunFinished | DocumentChanged,
    Field(discriminator="type"),
]
SERVER_EVENT_ADAPTER: TypeAdapter[ServerEvent] = TypeAdapter(ServerEvent)
DurableServerEvent = (
    RunStarted | MessageDelta | MessageDone | ToolCall | ApprovalRequested | ApprovalResolved
    | ToolDone | RunFinished | DocumentChanged
)
