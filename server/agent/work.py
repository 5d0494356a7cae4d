"""The work a run's child tasks do, each ending in the input the machine gets next.

A model turn streams its text to the document log as it comes (the hot
path: no model object per delta) and ends as `ModelFinished`,
`ModelUnparseable` (JSON tool format), `ModelFailed` (in our words, PROTOCOL.md
section 10) or `Crashed`. A server tool call ends as `ServerToolFinished`,
with "tool failed (ref ...)" instead of exception text. Neither decides
anything about the run.
"""

import asyncio
import functools
import logging
import time
import uuid
import weakref
from typing import Any

import orjson

from protocol.server import RunError
from server.agent import json_format
from server.agent.llm import LLM, ModelError, ModelRequest, TextChunk, ToolCallRequest, UsageChunk
from server.agent.run_state import ModelCall, RunState, ToolOutcome
from server.agent.steps import (
    Crashed,
    Input,
    ModelFailed,
    ModelFinished,
    ModelUnparseable,
    RunServerTool,
    ServerToolFinished,
)
from server.agent.tools import ServerTool, ToolBox
from server.ports import EventLog

logger = logging.getLogger("cowrite.agent")


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def new_ref() -> str:
    """A reference shared by a client-facing error and the log line that explains it."""
    return uuid.uuid4().hex[:12]


# A run's tool list for the model, built once per run (its ToolBox) instead of once
# per model turn: a server tool's JSON Schema comes from pydantic, which costs
# more than the rest of a tool round trip.
_offered: "weakref.WeakKeyDictionary[ToolBox, list[dict[str, Any]]]" = \
    weakref.WeakKeyDictionary()


@functools.lru_cache(maxsize=256)
def _server_tool_entry(tool: ServerTool) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": tool.name, "description": tool.description, "parameters": tool.parameters}}


def offered_tools(toolbox: ToolBox) -> list[dict[str, Any]]:
    """`toolbox.openai_tools()`, computed once per toolbox (the same list each turn;
    nobody mutates it)."""
    tools = _offered.get(toolbox)
    if tools is None:
        tools = [{"type": "function", "function": {
            "name": t.name, "description": t.description, "parameters": t.parameters}}
            for t in toolbox.client.values()]
        tools += [_server_tool_entry(t) for t in toolbox.server.values()]
        _offered[toolbox] = tools
    return tools


def _extra(state: RunState) -> dict[str, Any]:
    return {"run_id": state.run_id, "document_id": state.document_id}


async def model_turn(state: RunState, llm: LLM, log: EventLog, toolbox: ToolBox,
                     parts: list[str]) -> Input:
    """Call the model once; `parts` collects the streamed text (for an interrupted end)."""
    request = ModelRequest(
        messages=list(state.messages),
        tools=offered_tools(toolbox) if state.mode == "agent" and not state.json_tools else [],
        model=state.model, run_id=state.run_id, step=state.step - 1, prompt=state.prompt,
        context=state.context, client_tools=list(state.client_tools),
        tool_results=list(state.tool_results))
    usage: dict[str, int] = {}
    calls: list[ToolCallRequest] = []
    streamed = not state.json_tools and state.message_id is not None
    started = time.perf_counter()
    try:
        async for chunk in llm.stream(request):
            if isinstance(chunk, TextChunk):
                if chunk.text:
                    parts.append(chunk.text)
                    if streamed:
                        await log.publish_delta(state.run_id, str(state.message_id), chunk.text)
            elif isinstance(chunk, ToolCallRequest):
                calls.append(chunk)
            elif isinstance(chunk, UsageChunk):
                for key, value in chunk.usage.items():
                    usage[key] = usage.get(key, 0) + value
    except ModelError as exc:
        logger.warning("model call failed: status=%s kind=%s latency_ms=%.0f: %s",
                       exc.status, exc.kind, (time.perf_counter() - started) * 1000, exc,
                       extra=_extra(state))
        return ModelFailed(RunError(code="upstream_error", message=exc.public,
                                    details=exc.details))
    except Exception:
        ref = new_ref()
        logger.exception("model call failed (ref %s)", ref, extra=_extra(state))
        return Crashed(ref)
    text, used = "".join(parts), tuple(sorted(usage.items()))
    if not state.json_tools:
        return ModelFinished(text, tuple(check_call(toolbox, c) for c in calls), used,
                             at_ms=now_ms())
    answer = json_format.parse_answer(text)
    if isinstance(answer, str):
        return ModelUnparseable(text, answer, used)
    checked = (check_call(toolbox, answer.call),) if answer.call else ()
    return ModelFinished(answer.message, checked, used, assistant_content=text,
                         terminate=answer.terminate, at_ms=now_ms())


def check_call(toolbox: ToolBox, call: ToolCallRequest) -> ModelCall:
    checked = toolbox.check(call.name, call.arguments)
    if isinstance(checked, str):
        return ModelCall(call.call_id, call.name, call.arguments, problem=checked)
    return ModelCall(call.call_id, call.name, call.arguments, checked.arguments,
                     checked.executor, checked.requires_approval)


async def server_tool(state: RunState, toolbox: ToolBox, effect: RunServerTool,
                      timeout_s: float) -> ServerToolFinished:
    try:
        async with asyncio.timeout(timeout_s):
            output = await toolbox.run_server_tool(effect.name, effect.arguments)
        orjson.dumps(output)  # an output the log cannot hold is a failure of the tool
        outcome = ToolOutcome("ok", output=output)
    except TimeoutError:
        outcome = ToolOutcome("error", error={
            "message": f"{effect.name} took longer than {timeout_s:g} s",
            "code": "server_tool_timeout"})
    except Exception:
        ref = new_ref()
        logger.exception("server tool %s failed (ref %s)", effect.name, ref, extra=_extra(state))
        outcome = ToolOutcome("error", error={"message": f"tool failed (ref {ref})"})
    return ServerToolFinished(effect.call_id, outcome)
