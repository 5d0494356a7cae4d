"""`python -m protocol.schema` writes protocol/schema.json.

The file is checked in so client teams can generate types from it; a test
fails when it drifts from the models.
"""

import json
import sys
from pathlib import Path
from typing import Any

from protocol.client import CLIENT_MESSAGE_ADAPTER
from protocol.server import SERVER_EVENT_ADAPTER

SCHEMA_PATH = Path(__file__).with_name("schema.json")


def build_schema() -> dict[str, Any]:
    client = CLIENT_MESSAGE_ADAPTER.json_schema(ref_template="#/$defs/{model}")
    server = SERVER_EVENT_ADAPTER.json_schema(ref_template="#/$defs/{model}")
    defs: dict[str, Any] = {**client.pop("$defs", {}), **server.pop("$defs", {})}
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
