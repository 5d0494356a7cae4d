"""Helpers for run tests: scripted prompts, editor tool specs, event checks."""

from typing import Any

import orjson

from tests.harness import Client

READ = {"name": "read_document", "description": "Read the document.",
        "parameters": {"type": "object", "properties": {}, "additionalProperties": False}}
INSERT = {"name": "insert_text", "description": "Insert text.",
          "parameters": {"type": "object", "required": ["text"],
                         "properties": {"text": {"type": "string"},
                                        "position": {"enum": ["start", "end", "cursor"]}},
                         "additionalProperties": False}}
REPLACE_DOC = {"name": "replace_document", "description": "Replace everything.",
               "requires_approval": True,
               "parameters": {"type": "object", "required": ["text"],
                              "properties": {"text": {"type": "string"}},
                              "additionalProperties": False}}
EDITOR_TOOLS: list[dict[str, Any]] = [READ, INSERT, REPLACE_DOC]


def script(*steps: dict[str, Any], chunk_chars: int = 4, delay_ms: int = 0,
           **options: Any) -> str:
    return orjson.dumps({"script": list(steps), "chunk_chars": chunk_chars,
                         "delay_ms": delay_ms, **options}).decode()


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


async def start(client: Client, prompt: str, *, tools: list[dict[str, Any]] | None = None,
                **fields: Any) -> dict[str, Any]:
    """Send run.start; return its ack (the run.started event is left in the stream)."""
    message = {"type": "run.start", "id": "start", "prompt": prompt,
               "tools": EDITOR_TOOLS if tools is None else tools, **fields}
    await client.send(message)
    ack = await client.recv_until(lambda e: e.get("reply_to") == "start")
    assert ack["type"] == "ack", ack
    return ack


def of_run(events: list[dict[str, Any]], run_id: str, kind: str | None = None
           ) -> list[dict[str, Any]]:
    return [e for e in events if e.get("run_id") == run_id and "seq" in e
            and (kind is None or e["type"] == kind)]


async def answer(client: Client, tool_call: dict[str, Any], output: Any = None,
                 **extra: Any) -> None:
    message = {"type": "tool.result", "run_id": tool_call["run_id"],
               "call_id": tool_call["call_id"], "token": tool_call["token"], **extra}
    if "error" not in extra:
        message["output"] = output
    await client.send(message)
