"""The whole life of one run as a pure state machine.

`RunMachine.decide(state, input)` returns a `Decision`: the next `RunState`
and the effects that make it true (events to log, replies, a model call, a
server tool, timers, a checkpoint, the release of the document). There is no
asyncio, no socket and no backend here; `driver.py` executes the effects.
The shape follows python-websockets' sans-I/O `protocol.py` (state in,
events out) and openai-agents' explicit next step after each model turn.

Rules that hold for every transition (checked after every step of random
interleavings by tests/test_machine_properties.py): a run ends in exactly one
place, `_finish`, which logs the one `run.finished`; nothing leaves
`finished`; every call announced ends with one `tool.done`; calls run one at
a time, in the order the model asked for them.
"""

from collections.abc import Callable
from typing import Any

from protocol.codes import ErrorCode
from protocol.server import (
    Ack,
    ApprovalRequested,
    ApprovalResolved,
    DurableServerEvent,
    MessageDelta,
    MessageDone,
    RunError,
    RunFinished,
    RunStarted,
    RunStatus,
    ToolCall,
    ToolDone,
)
from server.agent import history, json_format
from server.agent.checkpoint_edits import survived_edit
from server.agent.edits import STALE, changes_note, judge_edit, later_version, sender_key, with_key
from server.agent.grown import grown, with_added
from server.agent.resume import resume_run
from server.agent.round_trip import WHOLE
from server.agent.run_state import (
    Ending,
    ModelCall,
    PendingCall,
    RunState,
    ToolOutcome,
    unique_call_ids,
)
from server.agent.steps import (
    CALL_MODEL,
    CHECKPOINT,
    DISARM_ALL,
    DISARM_GRACE,
    STOP_WORK,
    ApprovalAnswer,
    ArmTimer,
    Begin,
    Cancel,
    ClientToolResult,
    Crashed,
    Decision,
    DisarmTimer,
    DocumentEdited,
    EffectList,
    End,
    ExecutorPresence,
    Input,
    LeaseLost,
    MachineConfig,
    ModelFailed,
    ModelFinished,
    ModelUnparseable,
    Release,
    Remember,
    RememberPartial,
    Reply,
    Resume,
    RunServerTool,
    ServerToolFinished,
    TimerFired,
    after_end,
    call_token_problem,
    refuse,
    repeat_reply,
)


class RunMachine:
    def __init__(self, config: MachineConfig) -> None:
        self.config = config
        self._handlers: dict[type[Any], Callable[[RunState, Any, EffectList], RunState]] = {
            Begin: self._begin, ModelFinished: self._model_finished,
            ModelUnparseable: self._unparseable, ClientToolResult: self._client_result,
            ServerToolFinished: self._server_finished, ApprovalAnswer: self._approval,
            Cancel: self._cancel, TimerFired: self._timer, ExecutorPresence: self._presence,
            DocumentEdited: self._edited,
            ModelFailed: lambda state, event, out: self._finish(
                state, out, Ending("failed", "upstream_error", event.error)),
            End: lambda state, event, out: self._finish(
                state, out, Ending(event.status, event.reason)),
            Crashed: lambda state, event, out: self._finish(state, out, Ending.crash(event.ref)),
            LeaseLost: self._lease_lost,
            Resume: lambda state, event, out: resume_run(self, state, event, out),
        }

    def decide(self, state: RunState, event: Input) -> Decision:
        if state.finished:
            return after_end(state, event)
        if (whole := WHOLE.get(type(event))) and (decision := whole(self.config, state, event)):
            return decision  # the round trip's usual decisions, written out (round_trip.py)
        out = EffectList()
        state = self._handlers[type(event)](state, event, out)
        return Decision(state, out.effects, reply_to=getattr(event, "reply_to", None),
                        refusable=isinstance(event, (Begin, ClientToolResult, ApprovalAnswer)))

    def _begin(self, state: RunState, event: Begin, out: EffectList) -> RunState:
        if state.phase != "new":
            return state
        out.publish(RunStarted(run_id=state.run_id, mode=state.mode, user_id=state.user_id,
                               client_id=state.client_id, prompt=state.prompt,
                               thread_id=state.thread_id))
        out.do(Reply(Ack(reply_to=event.reply_to, run_id=state.run_id, status="running")),
               Remember((history.prompt_entry(state.run_id, state.prompt, state.thread_id,
                                              event.at_ms),)),
               ArmTimer("run", self.config.run_timeout_s))
        return self._call_model(state.evolve(started_ms=event.at_ms), out)

    def _call_model(self, state: RunState, out: EffectList) -> RunState:
        step = state.step + 1
        if self.config.checkpoint_steps:  # a checkpoint per model step (section 13)
            out.do(CHECKPOINT)
        out.do(CALL_MODEL)
        if state.edits:  # tell the model what people changed since its last request
            note = {"role": "user", "content": changes_note(state.edits)}
            state = state.evolve(messages=grown(state.messages, note), edits=())
        return state.evolve(phase="model", status="running", step=step,
                       message_id=f"{state.run_id}:m{step}")

    def _model_finished(self, state: RunState, event: ModelFinished, out: EffectList) -> RunState:
        if state.phase != "model":
            return state
        state = state.add_usage(dict(event.usage))
        if event.text and state.message_id is not None:
            if state.json_tools:  # not streamed: the answer's message is one delta
                out.publish(MessageDelta(run_id=state.run_id, message_id=state.message_id,
                                         delta=event.text))
            out.publish(MessageDone(run_id=state.run_id, message_id=state.message_id,
                                    text=event.text))
            out.do(Remember((history.assistant_entry(state.run_id, event.text,
                                                     thread_id=state.thread_id),)))
        if state.mode == "chat" or not event.calls:
            return self._finish(state, out, Ending("completed"))
        if state.step >= state.max_steps:
            return self._finish(state, out, Ending("failed", "max_steps", RunError(
                code="max_steps",
                message=f"the model still asked for tools after {state.max_steps} model calls")))
        calls = unique_call_ids(state.call_ids, event.calls, state.step)
        said = history.assistant_turn(state.json_tools, event.text, event.assistant_content,
                                      [(c.call_id, c.name, c.raw_arguments) for c in calls])
        state = state.evolve(phase="tools", messages=grown(state.messages, said),
                             terminate_after_tools=event.terminate,
                             call_ids=with_added(state.call_ids, [c.call_id for c in calls]))
        return self._advance(state, out, event.at_ms, calls)

    def _unparseable(self, state: RunState, event: ModelUnparseable, out: EffectList) -> RunState:
        if state.phase != "model":
            return state
        state = state.add_usage(dict(event.usage)).evolve(parse_failures=state.parse_failures + 1)
        if state.parse_failures > json_format.MAX_PARSE_RETRIES or state.step >= state.max_steps:
            why = f"could not be parsed {state.parse_failures} times" \
                if state.step < state.max_steps else \
                f"could not be parsed and was the last allowed (max_steps {state.max_steps})"
            return self._finish(state, out, Ending("failed", "invalid_model_output", RunError(
                code="invalid_model_output",
                message=f"the model's answer {why}; last problem: {event.problem}")))
        said = grown(state.messages, {"role": "assistant", "content": event.text})
        state = state.evolve(messages=grown(said, {"role": "user", "content": event.problem}))
        return self._call_model(state, out)

    def _advance(self, state: RunState, out: EffectList, at_ms: int,
                 queue: tuple[ModelCall, ...] | None = None) -> RunState:
        """Start the next call of the turn (`queue`, else the state's), or call the model
        again when none is left. The shorter queue is stored with the next change of
        the state, not in a copy of its own."""
        queue = state.queue if queue is None else queue
        while queue:
            call, queue = queue[0], queue[1:]
            if call.problem is not None or call.arguments is None:
                outcome = ToolOutcome("error", error={"message": call.problem or "invalid call",
                                                      "code": "invalid_call"})
                state = self._record(state, out, call.call_id, call.name, outcome, queue=queue)
                continue
            if call.requires_approval and call.name not in state.approved_names:
                timeout_s = self.config.approval_timeout_s
                pending = PendingCall(call.call_id, call.name, call.arguments, "approval",
                                      call.executor, at_ms + int(timeout_s * 1000))
                return self._open(state, out, pending, ApprovalRequested(
                    run_id=state.run_id, call_id=call.call_id, name=call.name,
                    arguments=call.arguments, expires_at=pending.expires_at), timeout_s,
                    queue=queue)
            return self._dispatch(state, out, call.call_id, call.name, call.arguments,
                                  call.executor, at_ms, queue=queue)
        return self._finish(state, out, Ending("completed")) if state.terminate_after_tools \
            else self._call_model(state, out)

    def _dispatch(self, state: RunState, out: EffectList, call_id: str, name: str,
                  arguments: dict[str, Any], executor: str, at_ms: int, **changes: Any
                  ) -> RunState:
        if executor == "server":
            state = state.evolve(current=PendingCall(call_id, name, arguments, "tool", "server",
                                                     0), status="running", **changes)
            out.do(CHECKPOINT)
            out.publish(ToolCall(run_id=state.run_id, call_id=call_id, name=name,
                                 arguments=arguments, executor="server",
                                 document_version=state.document_version))
            out.do(RunServerTool(call_id, name, arguments))
            return state
        expires_at = at_ms + int(self.config.tool_timeout_s * 1000)
        token = self.config.signer.issue_call_token(state.grant(call_id, state.user_id,
                                                                expires_at))
        pending = PendingCall(call_id, name, arguments, "tool", "client", expires_at, token)
        return self._open(state, out, pending, ToolCall(
            run_id=state.run_id, call_id=call_id, name=name, arguments=arguments,
            executor="client", client_id=state.client_id, token=token, expires_at=expires_at,
            document_version=state.document_version), self.config.tool_timeout_s, **changes)

    def _open(self, state: RunState, out: EffectList, pending: PendingCall,
              announcement: DurableServerEvent, timeout_s: float, **changes: Any) -> RunState:
        """Wait on `pending`: recorded (checkpoint) before it is announced."""
        status: RunStatus = "waiting_approval" if pending.kind == "approval" else "waiting_tool"
        state = state.evolve(current=pending, status=status, **changes)
        out.do(CHECKPOINT)
        out.publish(announcement)
        out.do(ArmTimer(pending.timer, timeout_s))
        if not state.executor_present:
            out.do(ArmTimer("grace", self.config.client_grace_s))
        return state

    def _close(self, state: RunState, out: EffectList, pending: PendingCall) -> RunState:
        out.do(DisarmTimer(pending.timer), DISARM_GRACE)
        return state.evolve(current=None, status="running")

    def _record(self, state: RunState, out: EffectList, call_id: str, name: str,
                outcome: ToolOutcome, **changes: Any) -> RunState:
        """The model will read this outcome; the history keeps it (with `changes`: one copy)."""
        content = outcome.for_model()
        message = history.tool_message(state.json_tools, call_id, name, content)
        out.do(Remember((history.tool_entry(state.run_id, call_id, name, content,
                                              state.thread_id),)))
        return state.evolve(messages=grown(state.messages, message), tool_results=grown(
            state.tool_results, {"name": name, "status": outcome.status,
                                 "output": outcome.output}), **changes)

    def _client_result(self, state: RunState, event: ClientToolResult, out: EffectList) -> RunState:
        signer, current = self.config.signer, state.current
        if current is None or current.call_id != event.call_id or current.kind != "tool" \
                or current.executor != "client":
            out.do(repeat_reply(state, event, signer))
            return state
        problem = call_token_problem(signer, state, current, event)
        if problem is not None:
            out.do(refuse(ErrorCode.INVALID_TOKEN, problem, event.reply_to, state.run_id))
            return state
        outcome = told = event.outcome
        if outcome.status == "error" and (outcome.error or {}).get("code") == "stale":
            told = ToolOutcome("error", error={"code": "stale", "message": STALE})
        changes: dict[str, Any] = {} if event.document_version is None else {  # it edited
            "document_version": later_version(state.document_version, event.document_version)}
        state = self._settle(state, out, current, outcome, told, event.at_ms, **changes,
                             completed_calls=with_added(state.completed_calls, (current.call_id,)))
        out.do(Reply(Ack(reply_to=event.reply_to, run_id=state.run_id, call_id=current.call_id,
                         status="accepted")))  # after the tool.done it confirms
        return state

    def _settle(self, state: RunState, out: EffectList, current: PendingCall,
                shown: ToolOutcome, told: ToolOutcome, at_ms: int, **changes: Any) -> RunState:
        # `current` ended with `shown` (its tool.done); the model reads `told`; go on.
        # Closing it (`_close`), recording and `changes` make one copy of the state.
        out.publish(ToolDone(run_id=state.run_id, call_id=current.call_id, status=shown.status,
                             output=shown.output, error=shown.error))
        out.do(DisarmTimer(current.timer), DISARM_GRACE, CHECKPOINT)
        return self._advance(self._record(state, out, current.call_id, current.name, told,
                                          current=None, status="running", **changes), out, at_ms)

    def _edited(self, state: RunState, event: DocumentEdited, out: EffectList) -> RunState:
        if event.key is not None:  # an edit sent again (refused `unavailable` after the run
            key = sender_key(event.user_id, event.key)  # applied it, `document.changed`
            if key in state.edit_keys:  # unlogged) is applied once
                return state
            state = state.evolve(edit_keys=with_key(state.edit_keys, key))
        verdict = judge_edit(state, event.user_id, event.origin, event.version, event.summary,
                             event.changes)
        if verdict.abort:
            return self._finish(state, out, Ending("aborted", "document_changed"))
        return survived_edit(state, verdict, event, out, self.config.checkpoint_steps)

    def _server_finished(self, state: RunState, event: ServerToolFinished, out: EffectList
                         ) -> RunState:
        current = state.current
        if current is None or current.call_id != event.call_id or current.executor != "server" \
                or current.kind != "tool":
            return state
        return self._settle(state, out, current, event.outcome, event.outcome, event.at_ms)

    def _approval(self, state: RunState, event: ApprovalAnswer, out: EffectList) -> RunState:
        if event.user_id != state.user_id:
            out.do(refuse(ErrorCode.FORBIDDEN, "only the run's user may answer its approvals",
                          event.reply_to, state.run_id))
            return state
        current = state.current
        if current is None or current.kind != "approval" or current.call_id != event.call_id:
            out.do(refuse(ErrorCode.CALL_NOT_PENDING, f"no approval {event.call_id!r} is pending",
                          event.reply_to, state.run_id))
            return state
        if event.decision == "approve" and event.problem is not None:
            out.do(refuse(ErrorCode.INVALID_MESSAGE, event.problem, event.reply_to, state.run_id,
                          details=[{"loc": ["arguments"], "msg": event.problem}]))
            return state
        out.publish(ApprovalResolved(run_id=state.run_id, call_id=current.call_id,
                                     decision=event.decision, user_id=event.user_id))
        state = self._close(state, out, current)
        ack = Reply(Ack(reply_to=event.reply_to, run_id=state.run_id, call_id=current.call_id,
                        status=event.decision))
        if event.decision == "approve":
            if event.scope == "run":
                state = state.evolve(approved_names=state.approved_names | {current.name})
            state = self._dispatch(state, out, current.call_id, current.name,
                                   event.arguments or current.arguments, current.executor,
                                   event.at_ms)
            out.do(ack)
            return state
        error: dict[str, Any] = {"message": "rejected by the user"}
        if event.reason:
            error["reason"] = event.reason
        rejected = ToolOutcome("rejected", error=error)
        state = self._settle(state, out, current, rejected, rejected, event.at_ms)
        out.do(ack)
        return state

    # -- endings ------------------------------------------------------------------
    def _lease_lost(self, state: RunState, event: LeaseLost, out: EffectList) -> RunState:
        # Another instance announced the end (server_lost): stop without a word.
        out.do(STOP_WORK, DISARM_ALL)
        return state.evolve(phase="finished", status="aborted", current=None, queue=(),
                       ending=Ending("aborted", "server_lost"))

    def _cancel(self, state: RunState, event: Cancel, out: EffectList) -> RunState:
        if event.user_id != state.user_id:
            out.do(refuse(ErrorCode.FORBIDDEN, "only the run's user may cancel it",
                          event.reply_to, state.run_id))
            return state
        state = self._finish(state, out, Ending("cancelled", "user_cancelled"))
        out.do(Reply(Ack(reply_to=event.reply_to, run_id=state.run_id, status="cancelled")))
        return state

    def _timer(self, state: RunState, event: TimerFired, out: EffectList) -> RunState:
        current = state.current
        if event.key == "run":
            return self._finish(state, out, Ending("timed_out", "run_timeout"))
        if event.key == "grace":
            if state.waiting_on_executor and not state.executor_present:
                return self._finish(state, out, Ending("aborted", "client_gone"))
            return state
        if current is None or event.key != current.timer:
            return state  # a timer of a call that already ended
        code = "approval_timeout" if current.kind == "approval" else "tool_timeout"
        message = "the approval timed out" if current.kind == "approval" else \
            f"no result within {self.config.tool_timeout_s:g} s"
        out.publish(ToolDone(run_id=state.run_id, call_id=current.call_id, status="timeout",
                             error={"message": message, "code": code}))
        return self._finish(state.evolve(current=None), out, Ending("timed_out", code))

    def _presence(self, state: RunState, event: ExecutorPresence, out: EffectList) -> RunState:
        if event.present == state.executor_present:
            return state
        if event.present:
            out.do(DISARM_GRACE)
        elif state.waiting_on_executor:
            out.do(ArmTimer("grace", self.config.client_grace_s))
        return state.evolve(executor_present=event.present)

    def _finish(self, state: RunState, out: EffectList, ending: Ending) -> RunState:
        """The one place a run ends: cancel what is in flight, settle the pending call,
        keep interrupted text, log `run.finished`, free the document."""
        out.do(STOP_WORK, DISARM_ALL)
        if ending.status != "completed":
            out.do(RememberPartial(ending.reason or ending.status))
        current = state.current
        if current is not None:
            note = f"run {ending.status}: {ending.reason or ''}".strip(": ")
            out.publish(ToolDone(run_id=state.run_id, call_id=current.call_id,
                                 status="cancelled", error={"message": note}))
        out.publish(RunFinished(run_id=state.run_id, status=ending.status, reason=ending.reason,
                                error=ending.error, steps=state.step,
                                usage=state.usage_dict() or None))
        out.do(Release(ending.status))
        return state.evolve(phase="finished", status=ending.status, current=None, queue=(),
                       ending=ending)
