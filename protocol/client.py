"""Client -> server messages (PROTOCOL.md section 4).

`parse_client_message` is the single entry point the server uses at the edge:
raw frame -> one of these models, or a `ParseFailure` saying which error to
answer with. Plain dicts never travel further inward.
"""

from typing import Annotated, Any, Literal

from pydantic import Field, TypeAdapter, model_validator

from protocol.base import (
    DEFAULT_THREAD,
    DOCUMENT_ID_PATTERN,
    DocumentVersion,
    Identifier,
    JsonObject,
    MessageId,
    NonNegativeInt,
    Note,
    Offset,
    ThreadId,
    ToolName,
    WireModel,
    WorkflowName,
)


class ClientMessageBase(WireModel):
    id: MessageId | None = None
    """Echoed as `reply_to` in the `ack` or `error` that answers this message."""


class ResumePoint(WireModel):
    """Where a reconnecting client left off in the document log."""

    epoch: str
    """`welcome.epoch` of the previous connection."""
    after_seq: NonNegativeInt
    """The last `seq` the client processed; replay starts after it."""


class Hello(ClientMessageBase):
    """First message on every connection: authenticates and joins the document session."""

    type: Literal["hello"]
    protocol: Literal[1] = 1
    """Protocol version; only 1 exists."""
    client_id: Identifier
    """Stable per browser tab across reconnects: tool calls are addressed to it."""
    token: str | None = None
    """The JWT (or send it as `Authorization: Bearer` on the upgrade request)."""
    resume: ResumePoint | None = None
    """Replay what was missed since a previous connection."""


class ToolSpec(WireModel):
    """A tool the client offers the model; the client that starts the run executes it."""

    name: ToolName
    """1-64 chars of `[A-Za-z0-9_-]`, unique within the run."""
    description: str = ""
    """What the tool does, for the model."""
    parameters: JsonObject = Field(default_factory=lambda: {"type": "object", "properties": {}})
    """JSON Schema (object) of the arguments; every call is validated against it."""
    requires_approval: bool = False
    """Ask the run's user (`approval.requested`) before each call."""


class DocumentContext(WireModel):
    """The document as the client sees it when the run starts."""

    text: str
    """The document's content."""
    version: DocumentVersion | None = None
    """The editor's version of this content, if it keeps one."""
    format: str | None = None
    """E.g. `markdown`, `html`, `plain`; free text for the model."""


class ScopeRange(WireModel):
    """A part of the document, `[from, to)` in the editor's own offsets (1.1)."""

    from_: Offset = Field(alias="from")
    """Start offset."""
    to: Offset
    """End offset (exclusive); at least `from`."""

    @model_validator(mode="after")
    def _ordered(self) -> "ScopeRange":
        if self.to < self.from_:
            raise ValueError("`to` must be at least `from`")
        return self


class TextChange(WireModel):
    """One edit: `[from, to)` of the document before it was replaced by `insert` units (1.1)."""

    from_: Offset = Field(alias="from")
    """Start of the replaced range."""
    to: Offset
    """End of the replaced range (exclusive); `to == from` for a pure insertion."""
    insert: Offset
    """How many units of new content replaced it (0 for a pure deletion)."""

    @model_validator(mode="after")
    def _ordered(self) -> "TextChange":
        if self.to < self.from_:
            raise ValueError("`to` must be at least `from`")
        return self


class RunContext(WireModel):
    """What the model is told about the editor besides the prompt."""

    document: DocumentContext | None = None
    """The document (saves the model a `read_document` call)."""
    selection: JsonObject | None = None
    """The user's selection, in whatever shape the editor uses."""
    extra: JsonObject | None = None
    """Anything else the model should see."""
    scope: list[ScopeRange] | None = Field(default=None, max_length=256)
    """The parts of the document the run works on (1.1, `on_edit: overlap`); absent: all."""


class RunOptions(WireModel):
    """Per-run options."""

    max_steps: Annotated[int, Field(ge=1)] | None = None
    """Model calls allowed in this run; can only lower the server's limit."""
    model: str | None = None
    """Model name for this run (default: the server's)."""
    on_edit: Literal["abort", "overlap", "continue"] = "abort"
    """What a user's edit does to the run (1.1): abort it, abort it only when it
    overlaps `context.scope`, or never."""
    if_busy: Literal["reject", "enqueue", "interrupt"] = "reject"
    """When another client's run is active (1.1): refuse, wait in line, or end it."""


class RunStart(ClientMessageBase):
    """Start an agent run (or a one-call chat) on the document."""

    type: Literal["run.start"]
    run_id: Identifier | None = None
    """Client-chosen id: a retry with the same id starts nothing and acks the run's status."""
    mode: Literal["agent", "chat"] = "agent"
    """`agent`: model and tools in a loop; `chat`: one model call, no tools."""
    prompt: str
    """The user's request."""
    context: RunContext | None = None
    """The document, selection and anything else the model should see."""
    tools: list[ToolSpec] = Field(default_factory=list, max_length=128)
    """Client tools (at most 128) this client executes for the run."""
    options: RunOptions | None = None
    """Per-run limits and model."""
    thread_id: ThreadId = DEFAULT_THREAD
    """The conversation thread: the model sees that thread's history only (1.1)."""
    workflow: WorkflowName | None = None
    """An operator-defined workflow (`GET /v1/workflows`): its prompt, tool allowlist,
    approvals and limits apply to the run (1.1)."""

    @model_validator(mode="after")
    def _unique_tool_names(self) -> "RunStart":
        names = [tool.name for tool in self.tools]
        if len(names) != len(set(names)):
            raise ValueError("tool names must be unique")
        return self


class ToolError(WireModel):
    """A failed client tool call, as told to the model."""

    message: str
    """What went wrong, for the model."""
    code: str | None = None
    """A short machine-readable code of the client's choosing."""


class ToolResult(ClientMessageBase):
    """The outcome of a client tool call: exactly one of `output` or `error`."""

    type: Literal["tool.result"]
    run_id: Identifier
    """`tool.call.run_id`."""
    call_id: Identifier
    """`tool.call.call_id`."""
    token: str
    """`tool.call.token`, copied verbatim (single-use, bound to run, call, user and document)."""
    output: Any = None
    """The tool's result, any JSON (null included); the model sees it."""
    error: ToolError | None = None
    """Instead of `output`: the tool failed."""
    document_version: DocumentVersion | None = None
    """The document's version after the tool ran, if it changed it."""

    @model_validator(mode="before")
    @classmethod
    def _exactly_one_outcome(cls, data: Any) -> Any:
        if isinstance(data, dict) and ("output" in data) == ("error" in data):
            raise ValueError("exactly one of 'output' or 'error' is required")
        return data


class Approval(ClientMessageBase):
    """The run's user answers an `approval.requested`."""

    type: Literal["approval"]
    run_id: Identifier
    """`approval.requested.run_id`."""
    call_id: Identifier
    """`approval.requested.call_id`."""
    decision: Literal["approve", "reject"]
    """`approve` dispatches the call; `reject` tells the model the user said no."""
    reason: Note | None = None
    """Why, for the model (with `reject`)."""
    scope: Literal["call", "run"] = "call"
    """`run` approves this tool for the rest of the run."""
    arguments: JsonObject | None = None
    """Approve with these edited arguments instead (validated like the model's)."""


class AuthRefresh(ClientMessageBase):
    """Replace the connection's token before it expires."""

    type: Literal["auth.refresh"]
    token: str
    """A fresh JWT for the same `sub`."""


class RunCancel(ClientMessageBase):
    """The run's user stops the run."""

    type: Literal["run.cancel"]
    run_id: Identifier
    """The run to cancel."""
    reason: Note | None = None
    """Free text, for the logs."""


class EditorChange(ClientMessageBase):
    """The document changed in this editor; broadcast as `document.changed`."""

    type: Literal["editor.change"]
    document_version: DocumentVersion | None = None
    """The editor's version after the change."""
    origin: Literal["user", "agent"] = "user"
    """`user` aborts the active run; `agent` (edits made by tool calls) never does."""
    summary: Note | None = None
    """What changed, in a few words."""
    changes: list[TextChange] | None = Field(default=None, max_length=1024)
    """The edits, in order, each in the coordinates left by the previous one (1.1).
    Without them a user edit is taken to touch the whole document."""


class Ping(ClientMessageBase):
    """Application-level ping; the server answers `pong` with the same `ts`."""

    type: Literal["ping"]
    ts: int | float | None = None
    """Any number, echoed in `pong`."""


ClientMessage = Annotated[
    Hello | RunStart | ToolResult | Approval | AuthRefresh | RunCancel | EditorChange | Ping,
    Field(discriminator="type"),
]
CLIENT_MESSAGE_ADAPTER: TypeAdapter[ClientMessage] = TypeAdapter(ClientMessage)
CLIENT_MESSAGE_TYPES = frozenset(
    {"hello", "run.start", "tool.result", "approval", "auth.refresh", "run.cancel",
     "editor.change", "ping"}
)
VIEWER_ALLOWED_TYPES = frozenset({"hello", "ping", "auth.refresh"})


__all__ = [
    "CLIENT_MESSAGE_ADAPTER",
    "DOCUMENT_ID_PATTERN",
    "VIEWER_ALLOWED_TYPES",
    "Approval",
    "AuthRefresh",
    "ClientMessage",
    "DocumentContext",
    "EditorChange",
    "Hello",
    "Ping",
    "ResumePoint",
    "RunCancel",
    "RunContext",
    "RunOptions",
    "RunStart",
    "ToolError",
    "ToolResult",
    "ToolSpec",
]
