"""The work a run's child tasks do, each ending in the input the machine gets next.

A model turn streams its text to the document log as it comes (the hot
path: no model object per delta) and ends as `ModelFinished`,
`ModelUnparseable` (JSON tool format), `ModelFailed` (in our words, PROTOCOL.md
section 10) or `Crashed`. A server tool call ends as `ServerToolFinished`,
with "tool failed (ref ...)" instead of exception text. Neither decides
anything about the run.
"""

import logging
import time
import uuid
from typing import Any

from protocol.server import RunError
from server.agent import json_format, pacing
from server.agent.llm import LLM, ModelError, ModelRequest, TextChunk, ToolCallRequest, UsageChunk
from server.agent.run_state import ModelCall, RunState, ToolOutcome
from server.agent.steps import (
    Crashed,
    Input,
    LeaseLost,
    ModelFailed,
    ModelFinished,
    ModelUnparseable,
    RunServerTool,
    ServerToolFinished,
)
from server.agent.tools import ToolBox
from server.backends.base import RunMovedOn
from server.ports import EventLog, ServerTools
from server.tools.context import ToolContext

logger = logging.getLogger("cowrite.agent")
tool_logger = logging.getLogger("cowrite.tools")


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def new_ref() -> str:
    """A reference shared by a client-facing error and the log line that explains it."""
    return uuid.uuid4().hex[:12]


def _extra(state: RunState) -> dict[str, Any]:
    return {"run_id": state.run_id, "document_id": state.document_id}


async def model_turn(state: RunState, llm: LLM, log: EventLog, toolbox: ToolBox,
                     parts: list[str]) -> Input:
    """Call the model once; `parts` collects the streamed text (for an interrupted end)."""
    request = ModelRequest(
        messages=state.messages,
        tools=toolbox.openai_tools() if state.mode == "agent" and not state.json_tools else [],
        model=state.model, run_id=state.run_id, step=state.step - 1, prompt=state.prompt,
        context=state.context, client_tools=state.client_tools,
        tool_results=state.tool_results)
    usage: dict[str, int] = {}
    calls: list[ToolCallRequest] = []
    streamed = not state.json_tools and state.message_id is not None
    started = time.perf_counter()
    gate = pacing.turns()  # while the loop is behind, a streaming run waits its turn
    try:
        async for chunk in llm.stream(request):
            if isinstance(chunk, TextChunk):
                if chunk.text:
                    parts.append(chunk.text)
                    if streamed:
                        await log.publish_delta(state.run_id, str(state.message_id), chunk.text)
                        turn = gate.after_delta()
                        if turn is not None:
                            await turn
            elif isinstance(chunk, ToolCallRequest):
                calls.append(chunk)
            elif isinstance(chunk, UsageChunk):
                for key, value in chunk.usage.items():
                    usage[key] = usage.get(key, 0) + value
    except RunMovedOn:  # this instance stalled and another took the run over
        return LeaseLost()
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


async def server_tool(state: RunState, tools: ServerTools, effect: RunServerTool
                      ) -> ServerToolFinished:
    """One server tool call through the catalog (which bounds it by the tool's timeout
    and hides failures behind a ref); cancelling this task cancels the tool."""
    context = ToolContext(state.run_id, state.document_id, state.user_id,
                          logging.LoggerAdapter(tool_logger, _extra(state)))
    result = await tools.invoke(effect.name, effect.arguments, context)
    return ServerToolFinished(effect.call_id, ToolOutcome(result.status, output=result.output,
                                                          error=result.error), now_ms())
