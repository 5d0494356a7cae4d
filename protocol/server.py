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
from protocol.snapshots import Limits as Limits
from protocol.snapshots import PendingItem as PendingItem
from protocol.snapshots import RunSnapshot as RunSnapshot
from protocol.snapshots import RunStatus as RunStatus

FinishedStatus = Literal["completed", "cancelled", "aborted", "failed", "timed_out"]
ToolDoneStatus = Literal["ok", "error", "rejected", "timeout", "cancelled"]
Role = Literal["editor", "viewer"]


class Welcome(WireModel):
    """Answer to a good `hello`; a resumed welcome is followed by the replayed events."""

    type: Literal["welcome"] = "welcome"
    protocol: int
    """Protocol version (1)."""
    session_id: str
    """Unique per connection (for logs and support)."""
    document_id: str
    """The document this connection opened."""
    user_id: str
    """The token's `sub`."""
    client_id: str
    """`hello.client_id`."""
    role: Role
    """`editor`, or `viewer` (read-only: may send only `hello`, `ping`, `auth.refresh`)."""
    epoch: str
    """Identity of the document log; keep it for `hello.resume`."""
    last_seq: NonNegativeInt
    """The log's last `seq` when this connection joined."""
    resumed: bool
    """True: the events after `resume.after_seq` follow, then live ones."""
    resume_failed: Literal["epoch_changed", "history_truncated"] | None = None
    """Why a requested resume was refused: rebuild from `active_run` and the history."""
    replayed: NonNegativeInt = 0
    """How many events the replay holds."""
    active_run: RunSnapshot | None = None
    """The document's active run, if any."""
    limits: Limits
    """This server's limits."""
    queued_runs: list[RunSnapshot] = Field(default_factory=list)
    """Runs waiting for the active one, next first (1.1, `if_busy: enqueue`)."""
    features: list[str] = Field(default_factory=list)
    """The protocol 1.1 additions this server supports (see "Version 1.1")."""


class Ack(WireModel):
    """A message with an `id` was accepted (sent only to its sender)."""

    type: Literal["ack"] = "ack"
    reply_to: str | None = None
    """The `id` of the message accepted."""
    run_id: str | None = None
    """The run concerned."""
    call_id: str | None = None
    """The tool call concerned."""
    duplicate: bool | None = None
    """True: a repeat of something already done; nothing changed."""
    status: str | None = None
    """E.g. the run's status for `run.start`, `accepted` for `tool.result`."""

    def to_wire(self) -> dict[str, Any]:
        """`WireModel.to_wire` by hand (fields are strings, bools or None): an ack
        answers every `tool.result`, and this is a fifth of `model_dump`'s cost."""
        wire: dict[str, Any] = {"type": self.type}
        for name in ("reply_to", "run_id", "call_id", "duplicate", "status"):
            if (value := getattr(self, name)) is not None:
                wire[name] = value
        return wire


class Error(WireModel):
    """A message was refused (sent only to its sender); the connection stays open unless noted."""

    type: Literal["error"] = "error"
    code: ErrorCode
    """One of the error codes (docs/protocol.md, Errors)."""
    message: str
    """For people; never exception text."""
    reply_to: str | None = None
    """The `id` of the message refused, when it could be read."""
    run_id: str | None = None
    """The run concerned."""
    details: Any = None
    """For `invalid_message`: a list of `{loc, msg}` saying where."""
    retry_after_ms: int | None = None
    """For `rate_limited` and `unavailable`: when to try again."""


class Pong(WireModel):
    """Answer to `ping`."""

    type: Literal["pong"] = "pong"
    ts: int | float | None = None
    """`ping.ts`, echoed."""


class DurableEvent(WireModel):
    """Base of logged events; `seq` and `ts` are stamped by the backend."""

    seq: int | None = None
    """Position in the document log: per document, from 1, no gaps."""
    ts: int | None = None
    """Server time, ms since the Unix epoch."""


class RunStarted(DurableEvent):
    """A run began."""

    type: Literal["run.started"] = "run.started"
    run_id: str
    """The run's id."""
    mode: Literal["agent", "chat"]
    """As in `run.start`."""
    user_id: str
    """Who started it."""
    client_id: str
    """The run's executor: the tab that runs its client tools."""
    prompt: str
    """The user's request."""
    thread_id: str = "main"
    """The conversation thread the run belongs to (1.1)."""


class MessageDelta(DurableEvent):
    """A piece of the assistant's text; append it to the message."""

    type: Literal["message.delta"] = "message.delta"
    run_id: str
    """The run's id."""
    message_id: str
    """The assistant message this piece belongs to."""
    delta: str
    """Text to append (consecutive deltas may arrive merged)."""


class MessageDone(DurableEvent):
    """An assistant message is complete."""

    type: Literal["message.done"] = "message.done"
    run_id: str
    """The run's id."""
    message_id: str
    """The message completed."""
    text: str
    """The whole message (the concatenated deltas)."""


class ToolCall(DurableEvent):
    """The model calls a tool; a client tool is executed by the tab named in `client_id`."""

    type: Literal["tool.call"] = "tool.call"
    run_id: str
    """The run's id."""
    call_id: str
    """The call's id; answer with `tool.result.call_id`."""
    name: str
    """The tool's name."""
    arguments: JsonObject
    """Arguments, already validated against the tool's `parameters`."""
    executor: Literal["client", "server"]
    """`client`: the tab `client_id` must run it; `server`: informational."""
    client_id: str | None = None
    """Client tools: the tab that must execute the call."""
    token: str | None = None
    """Client tools: single-use token to copy into `tool.result`."""
    expires_at: int | None = None
    """Client tools: deadline for the result, ms since the Unix epoch."""
    document_version: int | str | None = None
    """The latest document version the server knew when it sent the call (1.1): from
    `context.document.version`, later `editor.change`s and the run's earlier
    `tool.result.document_version` (an integer version never moves back on a result).
    A client may refuse a call computed on an older document with error code `stale`."""


class ApprovalRequested(DurableEvent):
    """A call of a `requires_approval` tool waits for the run's user."""

    type: Literal["approval.requested"] = "approval.requested"
    run_id: str
    """The run's id."""
    call_id: str
    """The call awaiting approval; answer with `approval.call_id`."""
    name: str
    """The tool's name."""
    arguments: JsonObject
    """The arguments the model proposes."""
    expires_at: int
    """Deadline for the answer, ms since the Unix epoch."""


class ApprovalResolved(DurableEvent):
    """An approval was answered (close the dialog in every tab)."""

    type: Literal["approval.resolved"] = "approval.resolved"
    run_id: str
    """The run's id."""
    call_id: str
    """The call that was approved or rejected."""
    decision: Literal["approve", "reject"]
    """The answer."""
    user_id: str
    """Who answered."""


class ToolDone(DurableEvent):
    """A tool call ended, however it ended."""

    type: Literal["tool.done"] = "tool.done"
    run_id: str
    """The run's id."""
    call_id: str
    """The call that ended."""
    status: ToolDoneStatus
    """`ok`, `error`, `rejected` (by the user), `timeout` or `cancelled` (run ended)."""
    output: Any = None
    """With `ok`: the result."""
    error: JsonObject | None = None
    """Otherwise: `{message, code?}`."""


class RunError(WireModel):
    """Why a run failed."""

    code: str
    """Machine-readable, e.g. `upstream_error`."""
    message: str
    """For people; never exception text."""
    details: JsonObject | None = None
    """Upstream failures: {kind, status?} (the kinds: see "Version 1.1")."""


class RunFinished(DurableEvent):
    """A run ended; exactly one per run."""

    type: Literal["run.finished"] = "run.finished"
    run_id: str
    """The run's id."""
    status: FinishedStatus
    """`completed`, `cancelled`, `aborted`, `failed` or `timed_out`."""
    reason: str | None = None
    """Why it ended early, e.g. `document_changed`, `user_cancelled`, `max_steps`."""
    error: RunError | None = None
    """With `failed`: what failed."""
    steps: int
    """Model calls made."""
    usage: JsonObject | None = None
    """Token usage reported by the model provider, if any."""


class DocumentChanged(DurableEvent):
    """Someone's editor reported a change (`editor.change`)."""

    type: Literal["document.changed"] = "document.changed"
    document_version: int | str | None = None
    """The editor's version after the change."""
    user_id: str
    """Who changed it."""
    client_id: str
    """In which tab."""
    origin: Literal["user", "agent"]
    """`user`: typed by a person; `agent`: applied by a tool call."""
    changes: list["ChangeSpan"] | None = None
    """The `editor.change`'s `changes`, when it sent them (1.1): what a run that waited
    in the queue meanwhile is judged by when it starts."""


class ChangeSpan(WireModel):
    """One edit: `[from, to)` of the document before it was replaced by `insert` units."""

    from_: int = Field(alias="from")
    """Start of the replaced range."""
    to: int
    """End of the replaced range (exclusive)."""
    insert: int
    """How many units of new content replaced it."""


class ScopeSpan(WireModel):
    """A range of the document, `[from, to)`."""

    from_: int = Field(alias="from")
    """Start offset."""
    to: int
    """End offset (exclusive)."""


class RunScopeChanged(DurableEvent):
    """An edit outside the run's scope moved it (1.1, `on_edit: overlap`)."""

    type: Literal["run.scope"] = "run.scope"
    run_id: str
    """The run."""
    scope: list[ScopeSpan]
    """The scope after the edit."""
    document_version: int | str | None = None
    """The version the edit produced."""
    user_id: str
    """Who edited."""


class RunQueued(DurableEvent):
    """A `run.start` with `if_busy: enqueue` waits for the active run (1.1)."""

    type: Literal["run.queued"] = "run.queued"
    run_id: str
    """The queued run's id."""
    user_id: str
    """Who asked for it."""
    client_id: str
    """Its executor."""
    prompt: str
    """The user's request."""
    position: int
    """1 = next to start."""


class RunResumed(DurableEvent):
    """Another instance took the run over and goes on from its last checkpoint (1.1)."""

    type: Literal["run.resumed"] = "run.resumed"
    run_id: str
    """The run."""
    step: int
    """Model calls made before the takeover."""
    reason: Literal["owner_lost", "handoff"]
    """`owner_lost`: the instance running it died; `handoff`: it was shutting down."""


class MessageDiscarded(DurableEvent):
    """Drop the text of this message: the model call that streamed it is made again (1.1)."""

    type: Literal["message.discarded"] = "message.discarded"
    run_id: str
    """The run."""
    message_id: str
    """The message whose deltas so far are void."""


ServerEvent = Annotated[
    Welcome | Ack | Error | Pong | RunStarted | MessageDelta | MessageDone | ToolCall
    | ApprovalRequested | ApprovalResolved | ToolDone | RunFinished | DocumentChanged
    | RunScopeChanged | RunQueued | RunResumed | MessageDiscarded,
    Field(discriminator="type"),
]
SERVER_EVENT_ADAPTER: TypeAdapter[ServerEvent] = TypeAdapter(ServerEvent)
DurableServerEvent = (
    RunStarted | MessageDelta | MessageDone | ToolCall | ApprovalRequested | ApprovalResolved
    | ToolDone | RunFinished | DocumentChanged | RunScopeChanged | RunQueued | RunResumed
    | MessageDiscarded
)
