"""The round trip's server events built as their wire object and encoded once.

A `tool.done`, `tool.call` or `ack` made as a pydantic model is validated, then
dumped by the model's serializer into a new dict, then encoded by orjson: about
80k of a round trip's ~685k instructions for its three events (callgrind). The
round trip's written-out decisions (`round_trip.py`) make the wire dict
themselves instead, with the keys in the model's field order and its None
fields left out (`WireModel.to_wire`), and encode it once with the same encoder
the log uses (orjson), so the bytes are the same; the log appends them
(`DocumentSession.publish_many`), a connection sends them (`Connection.reply`).

The model's serializer converts a few values orjson would encode its own way or
refuse (a subclass of str or dict, a datetime, a dataclass, non-string keys, an
integer beyond 64 bits). orjson refuses all of them here (`STRICT`), and the
written-out decision then leaves the input to the general machine, which builds
the models as before. `tests/test_hot_paths_wire_events.py` encodes random
values both ways and compares the bytes.

The model is still one call away (`event()`: validated from the wire dict, equal
to the general machine's); its fields read as attributes (tracing reads a few),
and an event compares equal to its model: decisions taken both ways compare equal.
"""

from typing import Any

import orjson
from pydantic import BaseModel

from protocol.base import WireModel
from protocol.server import DurableServerEvent

_FIELDS: dict[type[BaseModel], frozenset[str]] = {}

STRICT = orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME \
    | orjson.OPT_PASSTHROUGH_SUBCLASS


class WireEvent:
    """A server event as its `type`, wire dict and JSON text (`json`, UTF-8)."""

    __slots__ = ("json", "model", "type", "wire")

    def __init__(self, model: type[BaseModel], wire: dict[str, Any], json: bytes) -> None:
        self.model, self.wire, self.json = model, wire, json
        self.type: str = wire["type"]

    def to_wire(self) -> dict[str, Any]:
        """As `WireModel.to_wire`: a new dict (its caller may add to it)."""
        return dict(self.wire)

    def to_json(self) -> bytes:
        return self.json

    def event(self) -> BaseModel:
        """The pydantic model the general machine would have built."""
        return self.model.model_validate(self.wire)

    def __getattr__(self, name: str) -> Any:
        """A field of the model, as the model has it (None when left out): tracing reads
        a few (`call_id`, `status`...) without building the model. The field names are
        kept per model (`_FIELDS`): pydantic's `model_fields` costs ~1 us a read, and
        tracing's six reads a round trip showed in its overhead (1.036x -> 1.11x)."""
        fields = _FIELDS.get(self.model)
        if fields is None:
            fields = _FIELDS[self.model] = frozenset(self.model.model_fields)
        if name in fields:
            return self.wire.get(name)
        raise AttributeError(name)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, WireEvent):
            return self.model is other.model and self.json == other.json
        if isinstance(other, BaseModel):
            return type(other) is self.model and other.to_json() == self.json  # type: ignore[attr-defined]
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"WireEvent({self.json.decode()})"


def wire_event(model: type[BaseModel], wire: dict[str, Any]) -> WireEvent | None:
    """`wire` encoded, or None when orjson refuses it (`STRICT`): the model's
    serializer might have converted a value, so the caller takes the general path."""
    try:
        return WireEvent(model, wire, orjson.dumps(wire, option=STRICT))
    except TypeError:  # orjson.JSONEncodeError is one
        return None


LoggedEventSource = DurableServerEvent | WireEvent
"""What a decision's `Publish` logs: a model, or the same event as a `WireEvent`."""
Message = WireModel | WireEvent
"""What a `Reply` sends: a model, or the same message as a `WireEvent`."""
