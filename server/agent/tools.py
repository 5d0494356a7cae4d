"""The tools one run offers the model: the client's declared tools and server tools.

Server tools (built-in, Python, MCP) come from the operator's tool catalog
(`server/tools/`); a workflow may narrow every kind to an allowlist and add
approvals. Every call the model makes is checked here before anything is
dispatched: unknown tools and arguments that fail the tool's JSON Schema
become tool errors for the model, never a `tool.call` to a client. A client's
schemas are untrusted: their patterns must run on RE2 (`pattern_problem`,
checked when the run starts and again when a run is taken over).
"""

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

import jsonschema
import orjson

from protocol.client import ToolSpec
from protocol.jsonlimits import nesting_over
from protocol.parsing import DEFAULT_MAX_JSON_DEPTH
from server.ports import ServerTools
from server.records import quick_init
from server.tools.schemas import (
    ArgumentCheck,
    SchemaVerdicts,
    argument_check,
    pattern_problem,
    validator_class,
)

SCHEMA_CHECKS_CACHED = 512
VERDICTS_KEPT = 64  # per run
VERDICT_MAX_CHARS = 1024
_UNKNOWN: Any = object()
# How deep a frontend's answer holds a call's arguments: an AI SDK chat message holds
# them five levels down (body, messages, message, parts, part); the depth limit of
# every incoming frame applies to the whole answer.
ARGUMENTS_CARRIER_DEPTH = 8
# Why a schema is not a valid object schema (None: it is), per distinct schema:
# the metaschema check costs ~0.2 ms per tool (the largest share of admitting a run).
_schema_verdicts = SchemaVerdicts(lambda schema: _judge_schema(schema), SCHEMA_CHECKS_CACHED)


def check_tool_schemas(tools: list[ToolSpec]) -> str | None:
    """None when every declared `parameters` is a valid JSON Schema object; else why not."""
    for tool in tools:
        problem = _schema_problem(tool.parameters)
        if problem is not None:
            return f"tools.{tool.name}.parameters {problem}"
    return None


def _schema_problem(parameters: dict[str, Any]) -> str | None:
    return _schema_verdicts(parameters)


def _judge_schema(parameters: dict[str, Any]) -> str | None:
    if parameters.get("type", "object") != "object":
        return "must describe an object"
    try:
        validator_class(parameters).check_schema(parameters)
    except jsonschema.SchemaError as exc:
        return f"is not a valid JSON Schema: {exc.message}"
    except RecursionError:
        return "is nested too deeply"
    refused = pattern_problem(parameters)  # a client's patterns must run on RE2
    if refused is not None:
        return f"is not usable: {refused}"
    problem = argument_check("", parameters)  # jsonschema fails to compile a few
    return problem if isinstance(problem, str) else None


@quick_init
@dataclass(frozen=True, slots=True)
class CheckedCall:
    name: str
    arguments: dict[str, Any]
    executor: Literal["client", "server"]
    requires_approval: bool


def _usable(name: str, check: ArgumentCheck | str) -> ArgumentCheck:
    """A client tool's check; one whose schema cannot be used refuses every call."""
    if isinstance(check, str):
        return lambda _arguments: f"tool {name} cannot be called: {check}"
    return check


class ToolBox:
    """The tools of one run: client tools, then the server tools not shadowed by them,
    both narrowed to `allow` (a workflow's allowlist) when given."""

    def __init__(self, client_tools: Iterable[ToolSpec], server: ServerTools | None,
                 allow: frozenset[str] | None = None,
                 approval: frozenset[str] = frozenset(),
                 max_json_depth: int = DEFAULT_MAX_JSON_DEPTH) -> None:
        def allowed(name: str) -> bool:
            return allow is None or name in allow

        self.client = {tool.name: tool for tool in client_tools if allowed(tool.name)}
        self._catalog = server
        self.server = {spec.name: spec for spec in (server.specs() if server else [])
                       if spec.name not in self.client and allowed(spec.name)}
        self._approval = approval
        # arguments nested deeper could not come back in an answer (COWRITE_MAX_JSON_DEPTH)
        self._arguments_depth = max(1, max_json_depth - ARGUMENTS_CARRIER_DEPTH) \
            if max_json_depth > 0 else 0
        self._offered: list[dict[str, Any]] | None = None
        self._checks = {name: _usable(name, argument_check(name, tool.parameters,
                                                           untrusted=True))
                        for name, tool in self.client.items()}
        # (tool, raw arguments) -> the schema's verdict: a model repeats the same calls
        # (`{}` for a read) and jsonschema's walk is most of checking one.
        self._verdicts: dict[tuple[str, str], str | None] = {}

    def _schema_verdict(self, name: str, arguments: dict[str, Any]) -> str | None:
        return self._checks[name](arguments)

    def openai_tools(self) -> list[dict[str, Any]]:
        """The tools as the model is offered them: built once per run, not per turn."""
        if self._offered is None:
            specs = [(t.name, t.description, t.parameters) for t in self.client.values()]
            specs += [(t.name, t.description, t.parameters) for t in self.server.values()]
            self._offered = [
                {"type": "function",
                 "function": {"name": name, "description": description, "parameters": params}}
                for name, description, params in specs
            ]
        return self._offered

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
            encoded = orjson.dumps(arguments)
        except (TypeError, ValueError):
            return f"arguments of {name} are nested too deeply"
        if nesting_over(encoded, self._arguments_depth):
            return f"arguments of {name} nest deeper than {self._arguments_depth} levels"
        extra_approval = name in self._approval
        if name in self.client:
            key = (name, raw_arguments) if isinstance(raw_arguments, str) and \
                len(raw_arguments) <= VERDICT_MAX_CHARS else None
            problem = self._verdicts.get(key, _UNKNOWN) if key is not None else _UNKNOWN
            if problem is _UNKNOWN:
                try:
                    problem = self._schema_verdict(name, arguments)
                except RecursionError:
                    return f"arguments of {name} are nested too deeply"
                if key is not None and len(self._verdicts) < VERDICTS_KEPT:
                    self._verdicts[key] = problem
            if problem is not None:
                return str(problem)
            return CheckedCall(name, arguments, "client",
                               self.client[name].requires_approval or extra_approval)
        assert self._catalog is not None
        checked = self._catalog.check(name, arguments)
        if isinstance(checked, str):
            return checked
        return CheckedCall(name, checked, "server",
                           self.server[name].requires_approval or extra_approval)
