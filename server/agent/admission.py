"""What a `run.start` asks for, checked and turned into a run's first state.

Pure decisions (no I/O): whether the request is acceptable (tool schemas,
tool names that clash with server tools, the allowed models, the workflow),
and the `RunState` it starts from, with the workflow's system prompt, tool
allowlist, approvals and step limit applied (PROTOCOL.md sections 10, 14, 15).
"""

import uuid
from typing import Any

from protocol.client import RunStart
from server.agent import json_format
from server.agent.environment import RunEnvironment
from server.agent.history import model_messages
from server.agent.run_state import RunState
from server.agent.tools import ToolBox, check_tool_schemas
from server.tools.config import Workflow

Refusal = tuple[list[str | int], str]  # where (details loc) and why


def refusal(message: RunStart, env: RunEnvironment) -> Refusal | None:
    """Where and why a run.start is refused before anything is claimed."""
    problem = check_tool_schemas(message.tools)
    if problem is not None:
        return ["tools"], problem
    server_names = {spec.name for spec in env.tools.specs()} if env.tools else set()
    for index, tool in enumerate(message.tools):
        if tool.name in server_names:
            return (["tools", index, "name"],
                    f"tool {tool.name!r} is a server tool; name your client tool differently")
    model = message.options.model if message.options else None
    if model is not None and model not in env.allowed_models:
        return ["options", "model"], f"model {model[:64]!r} is not allowed on this server"
    if message.workflow is not None and workflow_of(message, env) is None:
        return ["workflow"], f"no workflow {message.workflow!r} on this server"
    return None


def workflow_of(message: RunStart, env: RunEnvironment) -> Workflow | None:
    if message.workflow is None or env.tools is None:
        return None
    return env.tools.workflow(message.workflow)


def first_state(message: RunStart, env: RunEnvironment, user_id: str, client_id: str,
                earlier: list[dict[str, Any]], executor_present: bool) -> RunState:
    """The run as it starts: identity, limits, tools and the model's first request."""
    settings, options = env.settings, message.options
    workflow = workflow_of(message, env)
    mode = workflow.mode if workflow is not None else message.mode
    max_steps = workflow.max_steps if workflow and workflow.max_steps else settings.max_steps
    if options is not None and options.max_steps is not None:
        max_steps = min(max_steps, options.max_steps)
    system_prompt = workflow.system_prompt if workflow and workflow.system_prompt \
        else settings.system_prompt
    run_id = message.run_id or f"run_{uuid.uuid4().hex[:16]}"
    json_tools = settings.tool_format == "json" and mode == "agent"
    state = RunState(
        run_id=run_id, document_id="", mode=mode, user_id=user_id, client_id=client_id,
        prompt=message.prompt,
        model=(options.model if options and options.model else settings.model),
        max_steps=max_steps, json_tools=json_tools, context=message.context,
        client_tools=tuple(message.tools) if mode == "agent" else (),
        thread_id=message.thread_id, workflow=workflow.name if workflow else None,
        tool_allowlist=frozenset(workflow.tools) if workflow and workflow.tools is not None
        else None,
        approval_tools=frozenset(workflow.approval) if workflow else frozenset(),
        messages=tuple(model_messages(system_prompt, earlier, run_id, message.prompt,
                                      message.context, message.thread_id,
                                      settings.history_max_chars)),
        executor_present=executor_present,
        on_edit=options.on_edit if options is not None else "abort",
        scope=None if message.context is None or message.context.scope is None else tuple(
            sorted((r.from_, r.to) for r in message.context.scope)),
        document_version=message.context.document.version
        if message.context is not None and message.context.document is not None else None)
    if json_tools:
        system = dict(state.messages[0])
        system["content"] = str(system["content"]) + json_format.instructions(
            toolbox_for(state, env).openai_tools())
        state = state.evolve(messages=(system, *state.messages[1:]))
    return state


def toolbox_for(state: RunState, env: RunEnvironment) -> ToolBox:
    if state.mode != "agent":
        return ToolBox([], None)
    return ToolBox(state.client_tools, env.tools, state.tool_allowlist, state.approval_tools,
                   env.settings.max_json_depth)
