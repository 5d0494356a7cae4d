"""The client tool round trip's two decisions, each as one function and one state copy.

A `tool.result` for the pending client call and the model's next turn that asks
for one client tool are most of what a tool-using run decides. The general
machine (`machine.py`) takes each through five to eight helpers, an
`EffectList` and two state copies; here each is written out once: checks that
select the common case (anything else returns None and the general code
decides), then the same values made in the same order, the state copied once,
the effects in the order the `EffectList` would have placed them.
`tests/test_hot_paths_round_trip.py` decides random states and inputs both
ways and compares the decisions.
"""

import hmac
from collections.abc import Callable
from typing import Any, get_args

from protocol.server import Ack, ToolCall, ToolDone, ToolDoneStatus
from server.agent import history
from server.agent.edits import STALE, later_version
from server.agent.grown import grown, with_added
from server.agent.run_state import (
    PendingCall,
    RunState,
    ToolOutcome,
    summed_usage,
    unique_call_ids,
)
from server.agent.steps import (
    CALL_MODEL,
    CHECKPOINT,
    DISARM_GRACE,
    ArmTimer,
    ClientToolResult,
    Decision,
    DisarmTimer,
    MachineConfig,
    ModelFinished,
    Publish,
    Remember,
    Reply,
)
from server.agent.wire_events import wire_event

DONE_STATUSES = frozenset(get_args(ToolDoneStatus))


def client_result(config: MachineConfig, state: RunState, event: ClientToolResult
                  ) -> Decision | None:
    """`_client_result` -> `_settle` -> `_record` -> `_advance` -> `_call_model`, for the
    result of the pending client call with the token the run issued for it, when the
    turn has no further call queued and no edit to tell the model about."""
    current = state.current
    if current is None or current.call_id != event.call_id or current.kind != "tool" \
            or current.executor != "client" or state.queue or state.terminate_after_tools \
            or state.edits:
        return None
    token = current.token  # `call_token_problem`'s own fast case, or the general code
    if token is None or event.user_id != state.user_id or event.at_ms > current.expires_at \
            or not event.token.isascii() or not hmac.compare_digest(event.token, token):
        return None
    outcome = told = event.outcome
    status, output, error = outcome.status, outcome.output, outcome.error
    if status not in DONE_STATUSES or (error is not None and type(error) is not dict):
        return None  # what `ToolDone` would refuse or convert
    run_id, call_id, name = state.run_id, current.call_id, current.name
    wire: dict[str, Any] = {"type": "tool.done", "run_id": run_id, "call_id": call_id,
                            "status": status}
    if output is not None:
        wire["output"] = output
    if error is not None:
        wire["error"] = error
    reply: dict[str, Any] = {"type": "ack"} if event.reply_to is None else {
        "type": "ack", "reply_to": event.reply_to}
    reply.update(run_id=run_id, call_id=call_id, status="accepted")
    if (done := wire_event(ToolDone, wire)) is None or \
            (ack := wire_event(Ack, reply)) is None:
        return None  # a value the models' serializer might convert: the general code's
    if status == "error" and (error or {}).get("code") == "stale":
        told = ToolOutcome("error", error={"code": "stale", "message": STALE})
    changes: dict[str, Any] = {} if event.document_version is None else {
        "document_version": later_version(state.document_version, event.document_version)}
    completed = with_added(state.completed_calls, (call_id,))
    disarm = DisarmTimer(current.timer)
    content = told.for_model()
    message = history.tool_message(state.json_tools, call_id, name, content)
    remember = Remember((history.tool_entry(run_id, call_id, name, content, state.thread_id),))
    step = state.step + 1
    new = state.evolve(
        messages=grown(state.messages, message),
        tool_results=grown(state.tool_results, {"name": name, "status": told.status,
                                                "output": told.output}),
        current=None, status="running", **changes, completed_calls=completed,
        phase="model", step=step, message_id=f"{run_id}:m{step}")
    return Decision(new, (CHECKPOINT, Publish((done,)), disarm, DISARM_GRACE, remember,
                          CALL_MODEL, Reply(ack)), True, event.reply_to)


def model_finished(config: MachineConfig, state: RunState, event: ModelFinished
                   ) -> Decision | None:
    """`_model_finished` -> `_advance` -> `_dispatch` -> `_open`, for an agent's turn with
    no text whose first call is a valid client call needing no approval."""
    if state.phase != "model" or state.mode != "agent" or event.text \
            or state.step >= state.max_steps or not event.calls:
        return None
    first = event.calls[0]
    arguments = first.arguments
    if first.problem is not None or arguments is None or first.executor != "client" \
            or (first.requires_approval and first.name not in state.approved_names):
        return None
    version = state.document_version
    if type(arguments) is not dict or type(event.at_ms) is not int or \
            (version is not None and type(version) is not int and type(version) is not str):
        return None  # what `ToolCall` would convert (a bool or float version, a Mapping)
    usage = dict(event.usage)  # `add_usage`, counted into the one copy below
    changes: dict[str, Any] = {"usage": summed_usage(state.usage, usage)} if usage else {}
    calls = unique_call_ids(state.call_ids, event.calls, state.step)
    call_id, name = calls[0].call_id, first.name
    timeout_s = config.tool_timeout_s
    expires_at = event.at_ms + int(timeout_s * 1000)
    token = config.signer.issue_call_token(state.grant(call_id, state.user_id, expires_at))
    wire: dict[str, Any] = {"type": "tool.call", "run_id": state.run_id, "call_id": call_id,
                            "name": name, "arguments": arguments, "executor": "client"}
    if state.client_id is not None:
        wire["client_id"] = state.client_id
    wire["token"], wire["expires_at"] = token, expires_at
    if version is not None:
        wire["document_version"] = version
    if (announcement := wire_event(ToolCall, wire)) is None:
        return None  # an argument the model's serializer might convert: the general code's
    said = history.assistant_turn(state.json_tools, event.text, event.assistant_content,
                                  [(c.call_id, c.name, c.raw_arguments) for c in calls])
    messages = grown(state.messages, said)
    call_ids = with_added(state.call_ids, [c.call_id for c in calls])
    pending = PendingCall(call_id, name, arguments, "tool", "client", expires_at, token)
    new = state.evolve(**changes, phase="tools", messages=messages,
                       terminate_after_tools=event.terminate,
                       call_ids=call_ids, current=pending, status="waiting_tool",
                       queue=calls[1:])
    arm = ArmTimer(pending.timer, timeout_s)
    effects = (CHECKPOINT, Publish((announcement,)), arm) if state.executor_present else \
        (CHECKPOINT, Publish((announcement,)), arm, ArmTimer("grace", config.client_grace_s))
    return Decision(new, effects)


WHOLE: dict[type[Any], Callable[[MachineConfig, Any, Any], Decision | None]] = {
    ClientToolResult: client_result, ModelFinished: model_finished}
