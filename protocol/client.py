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
    DOCUMENT_ID_PATTERN,
    Identifier,
    JsonObject,
    MessageId,
    NonNegativeInt,
    ToolName,
    WireModel,
)
from protocol.codes import ErrorCode
from protocol.jsonlimits import ORJSON_MAX_DEPTH, has_out_of_range_int, nesting_over


class ClientMessageBase(WireModel):
    id: MessageId | None = None


class ResumePoint(WireModel):
    epoch: str
    after_seq: NonNegativeInt


class Hello(ClientMessageBase):
    type: Literal["hello"]
    protocol: Literal[1] = 1
    client_id: Identifier
    token: str | None = None
    resume: ResumePoint | None = None


class ToolSpec(WireModel):
    name: ToolName
    description: str = ""
    parameters: JsonObject = Field(default_factory=lambda: {"type": "object", "properties": {}})
    requires_approval: bool = False


class DocumentContext(WireModel):
    text: str
    version: int | str | None = None
    format: str | None = None


class RunContext(WireModel):
    document: DocumentContext | None = None
    selection: JsonObject | None = None
    extra: JsonObject | None = None


class RunOptions(WireModel):
    max_steps: Annotated[int, Field(ge=1)] | None = None
    model: str | None = None


class RunStart(ClientMessageBase):
    type: Literal["run.start"]
    run_id: Identifier | None = None
    mode: Literal["agent", "chat"] = "agent"
    prompt: str
    context: RunContext | None = None
    tools: list[ToolSpec] = Field(default_factory=list, max_length=128)
    options: RunOptions | None = None

    @model_validator(mode="after")
    def _unique_tool_names(self) -> "RunStart":
        names = [tool.name for tool in self.tools]
        if len(names) != len(set(names)):
            raise ValueError("tool names must be unique")
        return self


class ToolError(WireModel):
    message: str
    code: str | None = None


class ToolResult(ClientMessageBase):
    type: Literal["tool.result"]
    run_id: Identifier
    call_id: Identifier
    token: str
    output: Any = None
    error: ToolError | None = None
    document_version: int | str | None = None

    @model_validator(mode="before")
    @classmethod
    def _exactly_one_outcome(cls, data: Any) -> Any:
        if isinstance(data, dict) and ("output" in data) == ("error" in data):
            raise ValueError("exactly one of 'output' or 'error' is required")
        return data


class Approval(ClientMessageBase):
    type: Literal["approval"]
    run_id: Identifier
    call_id: Identifier
    decision: Literal["approve", "reject"]
    reason: str | None = None
    scope: Literal["call", "run"] = "call"
    arguments: JsonObject | None = None


class AuthRefresh(ClientMessageBase):
    type: Literal["auth.refresh"]
    token: str


class RunCancel(ClientMessageBase):
    type: Literal["run.cancel"]
    run_id: Identifier
    reason: str | None = None


class EditorChange(ClientMessageBase):
    type: Literal["editor.change"]
    document_version: int | str | None = None
    origin: Literal["user", "agent"] = "user"
    summary: str | None = None


class Ping(ClientMessageBase):
    type: Literal["ping"]
    ts: int | float | None = None


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
