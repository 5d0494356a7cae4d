"""Tools a run offers the model: the client's declared tools and server tools.

Every call the model makes is checked here before anything is dispatched:
unknown tools and arguments that fail the tool's JSON Schema become tool
errors for the model, never a `tool.call` to a client.
"""

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

import jsonschema
import orjson
from pydantic import BaseModel, Field, ValidationError

from protocol.client import ToolSpec


@dataclass(frozen=True)
class ServerTool:
    """A tool the server runs itself, its arguments described by a pydantic model."""

    name: str
    description: str
    arguments: type[BaseModel]
    run: Callable[[BaseModel], Awaitable[Any]]
    requires_approval: bool = False

    @property
    def parameters(self) -> dict[str, Any]:
        return self.arguments.model_json_schema()


class TextStatsArguments(BaseModel):
    text: str = Field(description="The text to measure.")


_SENTENCE_END = re.compile(r"[.!?]+(?:\s|$)")


async def _text_stats(arguments: BaseModel) -> dict[str, Any]:
    assert isinstance(arguments, TextStatsArguments)
    text = arguments.text
    words = len(text.split())
    return {
        "characters": len(text),
        "words": words,
        "sentences": len(_SENTENCE_END.findall(text)) or (1 if text.strip() else 0),
        "lines": text.count("\n") + 1 if text else 0,
        "paragraphs": len([p for p in re.split(r"\n\s*\n", text) if p.strip()]),
        "reading_time_s": round(words / 238 * 60),
    }


TEXT_STATS = ServerTool(
    name="text_stats",
    description=(
        "Count characters, words, sentences, lines and paragraphs of a text and estimate its "
        "reading time. Use it instead of counting yourself, e.g. to meet a length limit."
    ),
    arguments=TextStatsArguments,
    run=_text_stats,
)
BUILTIN_SERVER_TOOLS: tuple[ServerTool, ...] = (TEXT_STATS,)


def check_tool_schemas(tools: list[ToolSpec]) -> str | None:
    """None when every declared `parameters` is a valid JSON Schema object; else why not."""
    for tool in tools:
        if tool.parameters.get("type", "object") != "object":
            return f"tools.{tool.name}.parameters must describe an object"
        try:
            jsonschema.Draft202012Validator.check_schema(tool.parameters)
        except jsonschema.SchemaError as exc:
            return f"tools.{tool.name}.parameters is not a valid JSON Schema: {exc.message}"
        except RecursionError:
            return f"tools.{tool.name}.parameters is nested too deeply"
    return None


@dataclass(frozen=True)
class CheckedCall:
    name: str
    arguments: dict[str, Any]
    executor: Literal["client", "server"]
    requires_approval: bool


class ToolBox:
    """The tools of one run. Client tools shadow server tools of the same name."""

    def __init__(self, client_tools: list[ToolSpec], server_tools: tuple[ServerTool, ...]) -> None:
        self.client = {tool.name: tool for tool in client_tools}
        self.server = {t.name: t for t in server_tools if t.name not in self.client}
        self._validators = {
            tool.name: jsonschema.Draft202012Validator(tool.parameters) for tool in client_tools
        }

    def openai_tools(self) -> list[dict[str, Any]]:
        specs = [(t.name, t.description, t.parameters) for t in self.client.values()]
        specs += [(t.name, t.description, t.parameters) for t in self.server.values()]
        return [
            {"type": "function",
             "function": {"name": name, "description": description, "parameters": parameters}}
            for name, description, parameters in specs
        ]

    def check(self, name: str, raw_arguments: str | dict[str, Any]) -> CheckedCall | str:
        """The call, validated; or the error message the model gets instead."""
        if name not in self.client and name not in self.server:
            known = ", ".join(sorted([*self.client, *self.server])) or "none"
            return f"unknown tool {name!r}; available tools: {known}"
        if isinstance(raw_arguments, str):
            try:
                arguments = orjson.loads(raw_arguments or "{}")
            except orjson.JSONDecodeError as exc:
                return f"arguments of {name} are not valid JSON: {exc.msg}"
        else:
            arguments = raw_arguments
        if not isinstance(arguments, dict):
            return f"arguments of {name} must be a JSON object"
        try:  # they travel in tool.call events: the log must be able to hold them
            orjson.dumps(arguments)
        except (TypeError, ValueError):
            return f"arguments of {name} are nested too deeply"
        if name in self.client:
            try:
                errors = sorted(self._validators[name].iter_errors(arguments),
                                key=lambda e: e.path)
            except RecursionError:
                return f"arguments of {name} are nested too deeply"
            if errors:
                where = "/".join(str(p) for p in errors[0].absolute_path) or "(arguments)"
                return f"invalid arguments for {name} at {where}: {errors[0].message}"
            return CheckedCall(name, arguments, "client", self.client[name].requires_approval)
        tool = self.server[name]
        try:
            tool.arguments.model_validate(arguments)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = "/".join(str(p) for p in first["loc"]) or "(arguments)"
            return f"invalid arguments for {name} at {where}: {first['msg']}"
        return CheckedCall(name, arguments, "server", tool.requires_approval)

    async def run_server_tool(self, name: str, arguments: dict[str, Any]) -> Any:
        tool = self.server[name]
        return await tool.run(tool.arguments.model_validate(arguments))
