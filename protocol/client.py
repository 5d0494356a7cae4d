"""Client -> server messages (PROTOCOL.md section 4).

`parse_client_message` is the single entry point the server uses at the edge:
raw frame -> one of these models, or a `ParseFailure` saying which error to
answer with. Plain dicts never travel further inward.
"""

import contextlib
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import orjson
from pydantic import Field, TypeAdapter, ValidationError, model_validator

from protocol.base import (
    DEFAULT_THREAD,
    DOCUMENT_ID_PATTERN,
    Identifier,
    JsonObject,
    MessageId,
    NonNegativeInt,
    ThreadId,
    ToolName,
    WireModel,
    WorkflowName,
)
from protocol.codes import ErrorCode
from protocol.jsonlimits import ORJSON_MAX_DEPTH, has_out_of_range_int, nesting_over


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
    version: int | str | None = None
    """The editor's version of this content, if it keeps one."""
    format: str | None = None
    """E.g. `markdown`, `html`, `plain`; free text for the model."""


class RunContext(WireModel):
    """What the model is told about the editor besides the prompt."""

    document: DocumentContext | None = None
    """The document (saves the model a `read_document` call)."""
    selection: JsonObject | None = None
    """The user's selection, in whatever shape the editor uses."""
    extra: JsonObject | None = None
    """Anything else the model should see."""


class RunOptions(WireModel):
    """Per-run options."""

    max_steps: Annotated[int, Field(ge=1)] | None = None
    """Model calls allowed in this run; can only lower the server's limit."""
    model: str | None = None
    """Model name for this run (default: the server's)."""


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
    document_version: int | str | None = None
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
    reason: str | None = None
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
    reason: str | None = None
    """Free text, for the logs."""


class EditorChange(ClientMessageBase):
    """The document changed in this editor; broadcast as `document.changed`."""

    type: Literal["editor.change"]
    document_version: int | str | None = None
    """The editor's version after the change."""
    origin: Literal["user", "agent"] = "user"
    """`user` aborts the active run; `agent` (edits made by tool calls) never does."""
    summary: str | None = None
    """What changed, in a few words."""


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


@dataclass(frozen=True, slots=True)
class ParseFailure:
    """Why a frame could not become a message, and what to answer."""

    code: ErrorCode
    message: str
    reply_to: str | None = None
    details: list[dict[str, Any]] | None = None


def peek_reply_to(data: object) -> str | None:
    """The frame's `id`, when it can be read, for `reply_to` in errors."""
    if isinstance(data, dict):
        message_id = data.get("id")
        if isinstance(message_id, str) and len(message_id) <= 64:
            return message_id
    return None


DEFAULT_MAX_JSON_DEPTH = 64


def decode_frame(
    text: str | bytes, max_depth: int = DEFAULT_MAX_JSON_DEPTH
) -> dict[str, Any] | ParseFailure:
    """JSON text -> object, or the `invalid_message` failure.

    Refused here, before anything else sees the frame (section 10): nesting
    deeper than `max_depth` levels of objects and arrays (0: only orjson's
    own limit of 1024) and integers outside the signed 64-bit range, which
    the decoder would otherwise turn into floats and the encoder refuse.
    """
    if nesting_over(text, max_depth):
        reply_to = None
        with contextlib.suppress(orjson.JSONDecodeError):
            reply_to = peek_reply_to(orjson.loads(text))
        return ParseFailure(
            ErrorCode.INVALID_MESSAGE,
            f"frame nests objects and arrays deeper than {max_depth} levels", reply_to,
            [{"loc": [], "msg": f"nesting deeper than {max_depth} levels",
              "max_depth": max_depth}],
        )
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        if "depth" in exc.msg:
            return ParseFailure(
                ErrorCode.INVALID_MESSAGE,
                f"frame nests objects and arrays deeper than {ORJSON_MAX_DEPTH} levels", None,
                [{"loc": [], "msg": f"nesting deeper than {ORJSON_MAX_DEPTH} levels",
                  "max_depth": ORJSON_MAX_DEPTH}],
            )
        return ParseFailure(ErrorCode.INVALID_MESSAGE, f"frame is not valid JSON: {exc.msg}")
    if not isinstance(data, dict):
        return ParseFailure(ErrorCode.INVALID_MESSAGE, "frame must be a JSON object")
    if has_out_of_range_int(text):
        return ParseFailure(
            ErrorCode.INVALID_MESSAGE, "frame holds an integer outside the signed 64-bit range",
            peek_reply_to(data),
            [{"loc": [], "msg": "integers must be between -2**63 and 2**63-1"}],
        )
    return data


def validate_message(data: dict[str, Any]) -> ClientMessage | ParseFailure:
    """A decoded object -> typed message, or the failure to answer with."""
    reply_to = peek_reply_to(data)
    message_type = data.get("type")
    if not isinstance(message_type, str):
        return ParseFailure(
            ErrorCode.INVALID_MESSAGE, "frame has no string 'type'", reply_to,
            [{"loc": ["type"], "msg": "required string"}],
        )
    if message_type not in CLIENT_MESSAGE_TYPES:
        return ParseFailure(
            ErrorCode.UNKNOWN_TYPE, f"unknown message type {message_type[:64]!r}", reply_to
        )
    try:
        return CLIENT_MESSAGE_ADAPTER.validate_python(data)
    except ValidationError as exc:
        details = [
            {"loc": list(err["loc"])[1:], "msg": err["msg"]} for err in exc.errors()[:10]
        ]
        problems = "; ".join(
            f"{'.'.join(str(p) for p in d['loc']) or '(message)'}: {d['msg']}"
            for d in details[:3]
        )
        return ParseFailure(
            ErrorCode.INVALID_MESSAGE, f"invalid {message_type}: {problems}", reply_to, details
        )


def parse_client_message(
    text: str | bytes, max_depth: int = DEFAULT_MAX_JSON_DEPTH
) -> ClientMessage | ParseFailure:
    decoded = decode_frame(text, max_depth)
    if isinstance(decoded, ParseFailure):
        return decoded
    return validate_message(decoded)


__all__ = [
    "CLIENT_MESSAGE_ADAPTER",
    "DEFAULT_MAX_JSON_DEPTH",
    "DOCUMENT_ID_PATTERN",
    "VIEWER_ALLOWED_TYPES",
    "Approval",
    "AuthRefresh",
    "ClientMessage",
    "DocumentContext",
    "EditorChange",
    "Hello",
    "ParseFailure",
    "Ping",
    "ResumePoint",
    "RunCancel",
    "RunContext",
    "RunOptions",
    "RunStart",
    "ToolError",
    "ToolResult",
    "ToolSpec",
    "decode_frame",
    "parse_client_message",
    "validate_message",
]
