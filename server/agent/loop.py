"""The agent loop of one run: model call, decide, run tools, repeat.

It follows openai-agents' discipline: an explicit next step after every
model turn (`state.next_step_after_turn`), a max-steps bound, tool errors
returned to the model instead of crashing the run, and cancellation that is
immediate (the coordinator cancels this task; the model stream closes in its
`finally`). Everything that touches other connections goes through `RunHost`.
"""

import uuid
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from protocol.server import DurableServerEvent, FinishedStatus, MessageDelta, MessageDone, RunError
from server.agent import json_format
from server.agent.history import assistant_entry, model_messages, tool_entry
from server.agent.llm import LLM, ModelRequest, TextChunk, ToolCallRequest, UsageChunk
from server.agent.state import (
    Completed,
    ExecuteTools,
    Fail,
    Run,
    ToolOutcome,
    next_step_after_turn,
)
from server.agent.tools import CheckedCall


class RunHost(Protocol):
    async def emit(self, run: Run, event: DurableServerEvent) -> None: ...

    async def emit_delta(self, run: Run, delta: str) -> None: ...

    async def remember(self, run: Run, entries: list[dict[str, Any]]) -> None: ...

    async def run_tool(self, run: Run, call_id: str, call: CheckedCall) -> ToolOutcome: ...


@dataclass(frozen=True)
class Finish:
    status: FinishedStatus
    reason: str | None = None
    error: RunError | None = None


class AgentLoop:
    def __init__(
        self, run: Run, llm: LLM, host: RunHost, *, system_prompt: str,
        history: list[dict[str, Any]], tool_format: Literal["native", "json"],
    ) -> None:
        self.run = run
        self.llm = llm
        self.host = host
        self.json_mode = tool_format == "json" and run.mode == "agent"
        self.messages = model_messages(system_prompt, history, run)
        self.tools = run.tools.openai_tools() if run.mode == "agent" else []
        self.client_tools = list(run.tools.client.values())
        if self.json_mode:
            self.messages[0]["content"] += json_format.instructions(self.tools)

    async def execute(self) -> Finish:
        run, parse_failures = self.run, 0
        while True:
            text, calls = await self._model_call()
            terminate = False
            if self.json_mode:
                answer = json_format.parse_answer(text)
                if isinstance(answer, str):
                    parse_failures += 1
                    if parse_failures > json_format.MAX_PARSE_RETRIES:
                        return Finish("failed", "invalid_model_output", RunError(
                            code="invalid_model_output",
                            message=f"the model's answer could not be parsed "
                                    f"{parse_failures} times; last error: {answer}"))
                    if run.step >= run.max_steps:
                        return Finish("failed", "max_steps")
                    self.messages += [{"role": "assistant", "content": text},
                                      {"role": "user", "content": answer}]
                    continue
                await self._publish_text(answer.message)
                calls, terminate = ([answer.call] if answer.call else []), answer.terminate
            if run.mode == "chat":
                return Finish("completed")
            decision = next_step_after_turn(calls, run.step, run.max_steps)
            if isinstance(decision, Completed):
                return Finish("completed")
            if isinstance(decision, Fail):
                return Finish("failed", decision.reason,
                              RunError(code=decision.reason, message=decision.message))
            assert isinstance(decision, ExecuteTools)
            finish = await self._execute_tools(text, decision.calls)
            if finish is not None:
                return finish
            if terminate:
                return Finish("completed")

    async def _model_call(self) -> tuple[str, list[ToolCallRequest]]:
        run = self.run
        # No copies: the model reads these during the call and keeps nothing.
        request = ModelRequest(
            messages=self.messages, tools=[] if self.json_mode else self.tools,
            model=run.model, run_id=run.run_id, step=run.step, prompt=run.prompt,
            context=run.context, client_tools=self.client_tools, tool_results=run.tool_results,
        )
        run.message_id = f"{run.run_id}:m{run.step + 1}"
        run.message_parts = []
        calls: list[ToolCallRequest] = []
        run.step += 1
        async for chunk in self.llm.stream(request):
            if isinstance(chunk, TextChunk):
                if not chunk.text:
                    continue
                run.message_parts.append(chunk.text)
                if not self.json_mode:
                    await self.host.emit_delta(run, chunk.text)
            elif isinstance(chunk, ToolCallRequest):
                calls.append(chunk)
            elif isinstance(chunk, UsageChunk):
                run.add_usage(chunk.usage)
        text = "".join(run.message_parts)
        if not self.json_mode:
            await self._finish_message(text)
        run.message_parts = []
        return text, calls

    async def _publish_text(self, text: str) -> None:
        """JSON mode: the answer's `message` becomes one delta and a done."""
        run = self.run
        if text and run.message_id:
            run.message_parts = [text]
            await self.host.emit(run, MessageDelta(
                run_id=run.run_id, message_id=run.message_id, delta=text))
            await self._finish_message(text)
            run.message_parts = []

    async def _finish_message(self, text: str) -> None:
        run = self.run
        if text and run.message_id:
            await self.host.emit(run, MessageDone(
                run_id=run.run_id, message_id=run.message_id, text=text))
            await self.host.remember(run, [assistant_entry(run, text)])

    async def _execute_tools(self, text: str, calls: list[ToolCallRequest]) -> Finish | None:
        run = self.run
        ids = [self._call_id(call) for call in calls]
        if self.json_mode:
            self.messages.append({"role": "assistant", "content": text})
        else:
            self.messages.append({
                "role": "assistant", "content": text or None,
                "tool_calls": [
                    {"id": call_id, "type": "function",
                     "function": {"name": call.name, "arguments": call.arguments}}
                    for call_id, call in zip(ids, calls, strict=True)
                ],
            })
        for call_id, call in zip(ids, calls, strict=True):
            checked = run.tools.check(call.name, call.arguments)
            if isinstance(checked, str):
                outcome = ToolOutcome("error", error={"message": checked, "code": "invalid_call"})
            else:
                outcome = await self.host.run_tool(run, call_id, checked)
            content = outcome.for_model()
            run.tool_results.append({"name": call.name, "status": outcome.status,
                                     "output": outcome.output})
            await self.host.remember(run, [tool_entry(run, call_id, call.name, content)])
            if self.json_mode:
                self.messages.append({"role": "user",
                                      "content": f"Result of tool {call.name}: {content}"})
            else:
                self.messages.append({"role": "tool", "tool_call_id": call_id, "content": content})
            if outcome.status == "timeout":
                reason = str((outcome.error or {}).get("code", "tool_timeout"))
                return Finish("timed_out", reason)
        return None

    def _call_id(self, call: ToolCallRequest) -> str:
        """The model's id when usable; a fresh one when missing, too long or reused."""
        call_id = call.call_id
        if not call_id or len(call_id) > 64 or call_id in self.run.call_ids:
            call_id = f"call_{uuid.uuid4().hex[:12]}"
        self.run.call_ids.add(call_id)
        return call_id
