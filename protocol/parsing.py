"""Frames -> client messages: the one entry point the server uses at the edge.

`parse_client_message` turns a raw frame into one of the models of
`protocol.client`, or a `ParseFailure` saying which error to answer with.
Limits are checked on the text before anything is built (PROTOCOL.md
section 10): nesting depth and integers beyond 64 bits.
"""

import contextlib
from dataclasses import dataclass
from typing import Any, get_args

import orjson
from pydantic import BaseModel, ValidationError

from protocol.client import CLIENT_MESSAGE_ADAPTER, ClientMessage
from protocol.codes import ErrorCode
from protocol.jsonlimits import ORJSON_MAX_DEPTH, has_out_of_range_int, nesting_over


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

# Each type's own model validator: what the discriminated union runs once it has read
# `type`, without the adapter's wrapper and dispatch. It accepts exactly what the union
# accepts for that type (tests/test_hot_paths_driver.py); the errors, whose locations
# the union prefixes with the type, still come from the union.
_MODELS: dict[str, type[BaseModel]] = {
    get_args(model.model_fields["type"].annotation)[0]: model
    for model in get_args(get_args(ClientMessage)[0])}
_VALIDATORS = {name: model.__pydantic_validator__ for name, model in _MODELS.items()}


def decode_frame(
    text: str | bytes, max_depth: int = DEFAULT_MAX_JSON_DEPTH, what: str = "frame"
) -> dict[str, Any] | ParseFailure:
    """JSON text -> object, or the `invalid_message` failure (whose message calls the
    text `what`: an HTTP edge says "body").

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
            f"{what} nests objects and arrays deeper than {max_depth} levels", reply_to,
            [{"loc": [], "msg": f"nesting deeper than {max_depth} levels",
              "max_depth": max_depth}],
        )
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        if "depth" in exc.msg:
            return ParseFailure(
                ErrorCode.INVALID_MESSAGE,
                f"{what} nests objects and arrays deeper than {ORJSON_MAX_DEPTH} levels", None,
                [{"loc": [], "msg": f"nesting deeper than {ORJSON_MAX_DEPTH} levels",
                  "max_depth": ORJSON_MAX_DEPTH}],
            )
        return ParseFailure(ErrorCode.INVALID_MESSAGE, f"{what} is not valid JSON: {exc.msg}")
    if not isinstance(data, dict):
        return ParseFailure(ErrorCode.INVALID_MESSAGE, f"{what} must be a JSON object")
    if has_out_of_range_int(text):
        return ParseFailure(
            ErrorCode.INVALID_MESSAGE, f"{what} holds an integer outside the signed 64-bit range",
            peek_reply_to(data),
            [{"loc": [], "msg": "integers must be between -2**63 and 2**63-1"}],
        )
    return data


def validate_message(data: dict[str, Any]) -> ClientMessage | ParseFailure:
    """A decoded object -> typed message, or the failure to answer with."""
    message_type = data.get("type")
    if not isinstance(message_type, str):
        return ParseFailure(
            ErrorCode.INVALID_MESSAGE, "frame has no string 'type'", peek_reply_to(data),
            [{"loc": ["type"], "msg": "required string"}],
        )
    validator = _VALIDATORS.get(message_type)
    if validator is None:
        return ParseFailure(
            ErrorCode.UNKNOWN_TYPE, f"unknown message type {message_type[:64]!r}",
            peek_reply_to(data)
        )
    try:
        message: ClientMessage = validator.validate_python(data, strict=True)
        return message
    except ValidationError:
        pass
    try:
        return CLIENT_MESSAGE_ADAPTER.validate_python(data, strict=True)
    except ValidationError as exc:
        details = [
            {"loc": list(err["loc"])[1:], "msg": err["msg"]} for err in exc.errors()[:10]
        ]
        problems = "; ".join(
            f"{'.'.join(str(p) for p in d['loc']) or '(message)'}: {d['msg']}"
            for d in details[:3]
        )
        return ParseFailure(
            ErrorCode.INVALID_MESSAGE, f"invalid {message_type}: {problems}",
            peek_reply_to(data), details
        )


def parse_client_message(
    text: str | bytes, max_depth: int = DEFAULT_MAX_JSON_DEPTH
) -> ClientMessage | ParseFailure:
    decoded = decode_frame(text, max_depth)
    if isinstance(decoded, ParseFailure):
        return decoded
    return validate_message(decoded)
