"""Taking a run over from its checkpoint (PROTOCOL.md section 13), as machine rules.

The new owner logs `run.resumed` and goes on where the checkpoint left the run:
a model call that was streaming is made again under a new message id (after
`message.discarded` when it had sent text); a pending client call or approval
keeps its call id, token and deadline (its timer is re-armed for what is
left); a server tool interrupted mid-call runs again only if it is
idempotent, otherwise the model is told it was interrupted.
"""

from typing import Any

from protocol.server import MessageDiscarded, RunResumed
from server.agent.run_state import RunState, ToolOutcome
from server.agent.steps import CALL_MODEL, CHECKPOINT, ArmTimer, EffectList, Resume, RunServerTool

INTERRUPTED = {"message": "interrupted: the server running this tool was lost; it was not "
                          "run again", "code": "interrupted"}


def resume_run(machine: Any, state: RunState, event: Resume, out: EffectList) -> RunState:
    config = machine.config
    out.publish(RunResumed(run_id=state.run_id, step=state.step, reason=event.reason))
    left_ms = state.started_ms + int(config.run_timeout_s * 1000) - event.at_ms
    out.do(CHECKPOINT, ArmTimer("run", max(0, left_ms) / 1000))
    current = state.current
    if state.phase == "model":
        if event.text_sent and state.message_id is not None:
            out.publish(MessageDiscarded(run_id=state.run_id, message_id=state.message_id))
        out.do(CALL_MODEL)
        return state.evolve(resumes=state.resumes + 1,
                       message_id=f"{state.run_id}:m{state.step}.r{state.resumes + 1}")
    if current is not None and current.executor == "server" and current.kind == "tool":
        if event.idempotent:
            out.do(RunServerTool(current.call_id, current.name, current.arguments))
            return state
        failed = ToolOutcome("error", error=dict(INTERRUPTED))
        return machine._settle(state, out, current, failed, failed, event.at_ms)  # type: ignore[no-any-return]
    if current is not None:  # a client call or an approval: same call, same deadline
        out.do(ArmTimer(current.timer, max(0, current.expires_at - event.at_ms) / 1000))
        if not state.executor_present:  # as when it was opened: a client gone for good
            out.do(ArmTimer("grace", config.client_grace_s))  # ends it, not the deadline
        return state
    return machine._advance(state, out, event.at_ms)  # type: ignore[no-any-return]
