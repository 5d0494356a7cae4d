"""`python -m protocol.schema` writes protocol/schema.json.

The file is checked in so client teams can generate types from it; a test
fails when it drifts from the models.

Client messages are described as the server *accepts* them (fields with a
default may be left out). Server events are described as the server *sends*
them: `WireModel.to_wire` omits None, so a field whose default is None is
optional and never null, every other field is always present, and durable
events always carry `seq` and `ts` (the backend stamps both when it logs the
event). Without this, `type` would look optional on every event, and code
generated from the schema could not narrow the event union by `type`.
"""

import json
import sys
from pathlib import Path
from typing import Any

from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from protocol.client import CLIENT_MESSAGE_ADAPTER
from protocol.server import SERVER_EVENT_ADAPTER

SCHEMA_PATH = Path(__file__).with_name("schema.json")
STAMPED_FIELDS = ("seq", "ts")


class SentSchema(GenerateJsonSchema):
    """JSON Schema of models as `to_wire()` serializes them (None fields omitted)."""

    def field_is_required(
        self,
        field: core_schema.ModelField | core_schema.DataclassField | core_schema.TypedDictField,
        total: bool,
    ) -> bool:
        schema = field["schema"]
        if schema["type"] != "default":
            return True
        return schema.get("default", ...) is not None  # a default_factory is always sent

    def nullable_schema(self, schema: core_schema.NullableSchema) -> JsonSchemaValue:
        return self.generate_inner(schema["schema"])

    def default_schema(self, schema: core_schema.WithDefaultSchema) -> JsonSchemaValue:
        if "default" in schema and schema["default"] is None:
            return self.generate_inner(schema["schema"])
        return super().default_schema(schema)


def _stamp_durable(defs: dict[str, Any]) -> None:
    """Durable events: `seq` and `ts` are optional in the model, always on the wire."""
    for definition in defs.values():
        properties = definition.get("properties", {})
        if all(name in properties for name in STAMPED_FIELDS):
            required = set(definition.get("required", [])) | set(STAMPED_FIELDS)
            definition["required"] = [name for name in properties if name in required]


def build_schema() -> dict[str, Any]:
    client = CLIENT_MESSAGE_ADAPTER.json_schema(ref_template="#/$defs/{model}")
    server = SERVER_EVENT_ADAPTER.json_schema(
        ref_template="#/$defs/{model}", schema_generator=SentSchema, mode="serialization"
    )
    client_defs: dict[str, Any] = client.pop("$defs", {})
    server_defs: dict[str, Any] = server.pop("$defs", {})
    shared = client_defs.keys() & server_defs.keys()
    if shared:  # one name would describe two different shapes
        raise ValueError(f"models used in both directions: {sorted(shared)}")
    _stamp_durable(server_defs)
    defs = {**client_defs, **server_defs}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "cowrite protocol v1",
        "description": "Every client->server message and server->client event.",
        "$defs": dict(sorted(defs.items())),
        "properties": {"client_message": client, "server_event": server},
    }


def render_schema() -> str:
    return json.dumps(build_schema(), indent=2, sort_keys=False) + "\n"


def main() -> int:
    SCHEMA_PATH.write_text(render_schema(), encoding="utf-8")
    print(f"wrote {SCHEMA_PATH}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
