"""Tool calling for models without function calling (`COWRITE_TOOL_FORMAT=json`).

The model is told the tools in its system prompt and answers with one JSON
object: `{"message"?: str, "tool": name | null, "parameters": {...},
"terminate": bool}`. Parsing is pure; the loop feeds parse errors back to the
model at most `MAX_PARSE_RETRIES` times before failing the run.
"""

import re
import uuid
from dataclasses import dataclass
from typing import Any

import orjson

from server.agent.llm import ToolCallRequest

MAX_PARSE_RETRIES = 3
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)


@dataclass(frozen=True)
class JsonAnswer:
    message: str
    call: ToolCallRequest | None
    terminate: bool


def instructions(tools: list[dict[str, Any]]) -> str:
    lines = [
        "",
        "You can use these tools:",
        *(f"- {t['function']['name']}: {t['function']['description']} "
          f"Parameters (JSON Schema): {orjson.dumps(t['function']['parameters']).decode()}"
          for t in tools),
        "Answer with exactly one JSON object and nothing else:",
        '{"message": "text for the user (optional)", "tool": "<tool name or null>", '
        '"parameters": {...}, "terminate": true or false}',
        "Use one tool per answer; its result comes back in the next message. Set "
        '"terminate" to true, with "tool": null, when you are done.',
    ]
    return "\n".join(lines)


def parse_answer(text: str) -> JsonAnswer | str:
    """The answer, or a parse error to send back to the model."""
    body = text.strip()
    fenced = _FENCE.match(body)
    if fenced:
        body = fenced.group(1)
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        return f"your answer is not valid JSON ({exc.msg}); answer with one JSON object only"
    if not isinstance(data, dict):
        return "your answer must be a JSON object"
    tool, parameters = data.get("tool"), data.get("parameters", {})
    message, terminate = data.get("message", ""), data.get("terminate", tool is None)
    if tool is not None and (not isinstance(tool, str) or not tool):
        return '"tool" must be a tool name or null'
    if not isinstance(parameters, dict):
        return '"parameters" must be a JSON object'
    if not isinstance(terminate, bool):
        return '"terminate" must be true or false'
    if not isinstance(message, str):
        return '"message" must be a string'
    call = None
    if tool is not None:
        arguments = orjson.dumps(parameters).decode()
        call = ToolCallRequest(f"call_{uuid.uuid4().hex[:10]}", tool, arguments)
    return JsonAnswer(message, call, terminate)
