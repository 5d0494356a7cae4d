"""The run machine alone, driven by random interleavings of every input.

A small in-test executor plays the driver's part: it keeps the committed
state, logs published events, tracks timers and work in flight, and injects
backend failures into publishes (a refused client input leaves the state as
it was; a failed internal publish makes the driver feed `Crashed`). After
every step the invariants of the run lifecycle are checked.
"""

from dataclasses import replace
from typing import Any

import orjson
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from protocol.server import Ack, ApprovalRequested, RunError, RunFinished, ToolCall, ToolDone
from server.agent.checkpoint import from_checkpoint, to_checkpoint
from server.agent.edits import sender_key
from server.agent.machine import RunMachine
from server.agent.run_state import STATUS_RANK, ModelCall, RunState, ToolOutcome
from server.agent.steps import (
    ApprovalAnswer,
    ArmTimer,
    Begin,
    CallModel,
    Cancel,
    ClientToolResult,
    Crashed,
    Decision,
    DisarmTimer,
    DocumentEdited,
    End,
    ExecutorPresence,
    Input,
    LeaseLost,
    MachineConfig,
    ModelFailed,
    ModelFinished,
    ModelUnparseable,
    Publish,
    Release,
    Reply,
    Resume,
    RunServerTool,
    ServerToolFinished,
    StopWork,
    TimerFired,
)
from server.agent.wire_events import WireEvent
from server.auth import Authenticator
from server.settings import Settings

AUTH = Authenticator(Settings(jwt_secret="property-secret-0123456789abcdef"))
CONFIG = MachineConfig(signer=AUTH, tool_timeout_s=60, approval_timeout_s=300,
                       run_timeout_s=600, client_grace_s=30)
MACHINE = RunMachine(CONFIG)
TOOLS = {  # name -> (executor, requires_approval)
    "read": ("client", False), "edit": ("client", True), "stats": ("server", False),
    "risky": ("server", True),
}
# The rules that end a run from outside act one time in four: at full rate they
# ended most runs within a few steps, and a server tool followed by a client call
# in one turn was reached 7 times in 1,500 examples.
RARELY = st.integers(0, 3).map(lambda n: n == 0)
ENDINGS = [("aborted", "document_changed"), ("cancelled", "superseded"),
           ("aborted", "server_shutdown"), ("aborted", "server_lost")]


def model(event: Any) -> Any:
    """An event as its pydantic model: the round trip's written-out decisions make
    `WireEvent`s (`server/agent/wire_events.py`), which the rules read as models."""
    return event.event() if type(event) is WireEvent else event


def new_state(json_tools: bool, max_steps: int, on_edit: str = "abort") -> RunState:
    return RunState(run_id="r1", document_id="d1", mode="agent", user_id="alice",
                    client_id="tab", prompt="p", model="m", max_steps=max_steps,
                    json_tools=json_tools, on_edit=on_edit,  # type: ignore[arg-type]
                    scope=((10, 20),) if on_edit == "overlap" else None)


class RunLifecycle(RuleBasedStateMachine):
    @initialize(json_tools=st.booleans(), max_steps=st.integers(1, 6),
                begin_fails=st.booleans(),
                on_edit=st.sampled_from(["abort", "overlap", "continue"]))
    def begin(self, json_tools: bool, max_steps: int, begin_fails: bool,
              on_edit: str = "abort") -> None:
        self.state = new_state(json_tools, max_steps, on_edit)
        self.log: list[Any] = []
        self.replies: list[Any] = []
        self.timers: set[str] = set()
        self.just_disarmed: set[str] = set()  # by the last decision
        self.model_calls = 0
        self.model_busy = False
        self.tool_busy: str | None = None
        self.released = 0
        self.lost_lease = False
        self.fail_next_publish = False
        self.statuses = [self.state.status]
        self.tokens: dict[str, str] = {}
        self.calls_seen = 0
        self.apply(Begin(0, "start"), fail=begin_fails)
        if begin_fails:  # refused: nothing logged; start again as the coordinator would
            assert self.state.phase == "new" and not self.log
            self.apply(Begin(0, "start"))

    # -- the executor -------------------------------------------------------------
    def apply(self, event: Input, fail: bool = False) -> None:
        """The driver's rules: a decision's one `Publish` is its commit point."""
        fail = fail or self.fail_next_publish
        self.fail_next_publish = False
        decision: Decision = MACHINE.decide(self.state, event)
        self.just_disarmed = set()
        publishes = [e for e in decision.effects if isinstance(e, Publish)]
        assert len(publishes) <= 1, "a decision logs one group"
        if publishes:  # nothing is confirmed before the events that make it true
            before = decision.effects[:decision.effects.index(publishes[0])]
            assert not any(isinstance(e, Reply) and isinstance(model(e.message), Ack)
                           for e in before), "an ack before its events"
        if fail and publishes and not decision.state.finished:
            if not decision.refusable:  # the driver ends the run from the state it had
                self.apply(Crashed("ref"))
            return  # nothing of the decision happened
        opened, at_ms = decision.state.current, getattr(event, "at_ms", None)
        if opened is not None and opened != self.state.current and opened.executor == "client" \
                and at_ms is not None:  # a deadline counts from the input that opened it
            assert opened.expires_at > at_ms, (opened, event)
        self.state = decision.state
        for effect in decision.effects:
            if isinstance(effect, Publish):
                self.log.extend(model(e) for e in effect.events)
            elif isinstance(effect, Reply):
                self.replies.append(model(effect.message))
            elif isinstance(effect, CallModel):
                assert not self.model_busy, "two model calls at once"
                self.model_busy, self.model_calls = True, self.model_calls + 1
            elif isinstance(effect, RunServerTool):
                assert self.tool_busy is None, "two server tools at once"
                self.tool_busy = effect.call_id
            elif isinstance(effect, StopWork):
                self.model_busy, self.tool_busy = False, None
            elif isinstance(effect, ArmTimer):
                self.timers.add(effect.key)
            elif isinstance(effect, DisarmTimer):
                gone = set(self.timers) if effect.key == "*" else self.timers & {effect.key}
                self.just_disarmed |= gone
                self.timers -= gone
            elif isinstance(effect, Release):
                self.released += 1
        if isinstance(event, LeaseLost):
            self.lost_lease = True
        self.statuses.append(self.state.status)

    # -- inputs ---------------------------------------------------------------------
    @precondition(lambda self: self.model_busy)
    @rule(text=st.text(max_size=8),
          calls=st.lists(st.tuples(st.sampled_from([*TOOLS, "nope"]), st.booleans(),
                                   st.just("ok") | st.sampled_from(  # half of them fresh
                                       ["", "dup", "x" * 70, "call_s1_0", "call_s2_0",
                                        "call_s2_1"])), max_size=3),
          terminate=st.booleans())
    def model_finishes(self, text: str, calls: list[tuple[str, bool, str]],
                       terminate: bool) -> None:
        self.model_busy = False
        checked = []
        for name, valid, call_id in calls:
            self.calls_seen += 1
            cid = "dup" if call_id == "dup" else call_id if call_id != "ok" else \
                f"c{self.calls_seen}"
            if name not in TOOLS or not valid:
                checked.append(ModelCall(cid, name, "{}", problem="invalid"))
            else:
                executor, approval = TOOLS[name]
                checked.append(ModelCall(cid, name, "{}", {}, executor,  # type: ignore[arg-type]
                                         approval))
        used = len(self.state.call_ids)
        self.apply(ModelFinished(text, tuple(checked), (("total_tokens", 3),),
                                 terminate=terminate, at_ms=1000))
        if not self.state.finished:  # the turn's calls were taken, each under its own id
            assert len(self.state.call_ids) == used + len(checked), \
                "a call id was given to two calls of the run"

    @precondition(lambda self: self.model_busy and self.state.json_tools)
    @rule()
    def model_unparseable(self) -> None:
        self.model_busy = False
        self.apply(ModelUnparseable("{", "not JSON"))

    @precondition(lambda self: self.model_busy)
    @rule()
    def model_fails(self) -> None:
        self.model_busy = False
        self.apply(ModelFailed(RunError(code="upstream_error", message="HTTP 500")))

    @precondition(lambda self: self.tool_busy is not None)
    @rule(ok=st.booleans(), at_ms=st.integers(1000, 200_000))
    def server_tool_finishes(self, ok: bool, at_ms: int) -> None:
        call_id, self.tool_busy = self.tool_busy, None
        assert call_id is not None
        outcome = ToolOutcome("ok", output={"n": 1}) if ok else \
            ToolOutcome("error", error={"message": "tool failed (ref x)"})
        self.apply(ServerToolFinished(call_id, outcome, at_ms))

    @rule(which=st.sampled_from(["current", "other", "done"]), good_token=st.booleans(),
          user=st.sampled_from(["alice", "bob"]), at_ms=st.integers(0, 200_000))
    def client_result(self, which: str, good_token: bool, user: str, at_ms: int) -> None:
        current = self.state.current
        calls = [e.call_id for e in self.log if isinstance(e, ToolCall) and e.token]
        call_id = current.call_id if which == "current" and current else \
            calls[0] if which == "done" and calls else "unknown"
        token = next((e.token for e in self.log if isinstance(e, ToolCall)
                      and e.call_id == call_id and e.token), None)
        self.apply(ClientToolResult(call_id, token if good_token and token else "bad",
                                    ToolOutcome("ok", output=1), user, at_ms, "r"))

    @rule(decision=st.sampled_from(["approve", "reject"]), scope=st.sampled_from(["call", "run"]),
          user=st.sampled_from(["alice", "bob"]), problem=st.booleans(),
          right_call=st.booleans())
    def approval(self, decision: str, scope: str, user: str, problem: bool,
                 right_call: bool) -> None:
        current = self.state.current
        call_id = current.call_id if right_call and current else "other"
        self.apply(ApprovalAnswer(call_id, user, decision, scope,  # type: ignore[arg-type]
                                  None, "bad arguments" if problem else None, None, 500, "a"))

    @precondition(lambda self: self.state.current is not None
                  and self.state.current.kind == "approval")
    @rule(scope=st.sampled_from(["call", "run"]))
    def user_approves(self, scope: str) -> None:
        """The pending approval approved as a user would: the random `approval` rule
        above rarely gets every argument right."""
        self.approval("approve", scope, self.state.user_id, False, True)

    @rule(user=st.sampled_from(["alice", "bob"]), now=RARELY)
    def cancel(self, user: str, now: bool) -> None:
        if now:
            self.apply(Cancel(user, "c"))

    @rule(ending=st.sampled_from(ENDINGS), now=RARELY)
    def ended_from_outside(self, ending: tuple[str, str], now: bool) -> None:
        if now:
            self.apply(End(ending[0], ending[1]))  # type: ignore[arg-type]

    @rule(data=st.data())
    def timer_fires(self, data: st.DataObject) -> None:
        keys = sorted(self.timers) or ["run"]
        key = data.draw(st.sampled_from([*keys, "grace", "call:stale"]))
        self.timers.discard(key)
        self.apply(TimerFired(key))

    @rule(present=st.booleans())
    def presence(self, present: bool) -> None:
        self.apply(ExecutorPresence(present))

    @rule(now=RARELY)
    def lease_lost(self, now: bool) -> None:
        if now:
            self.apply(LeaseLost())

    @rule(idempotent=st.booleans(), text_sent=st.booleans())
    def owner_lost_and_checkpoint_restored(self, idempotent: bool, text_sent: bool) -> None:
        """Another instance takes the run over from its checkpoint (JSON round trip): the
        old owner's timers and work are gone; the new owner resumes."""
        if self.state.finished or self.state.phase == "new":
            return
        restored = from_checkpoint(orjson.loads(orjson.dumps(to_checkpoint(self.state))))
        assert restored == self.state, "the checkpoint must restore the state exactly"
        self.timers, self.model_busy, self.tool_busy = set(), False, None
        self.state = restored
        self.apply(Resume("owner_lost", 1500, text_sent, idempotent))

    @rule(key=st.sampled_from([None, "c1.k1", "c1.k2", "c2.k3", "c3.k4"]),
          origin=st.sampled_from(["user", "agent"]),
          change=st.sampled_from([None, (0, 0, 2), (12, 13, 1), (40, 40, 1)]), now=RARELY)
    def edited(self, key: str | None, origin: str, change: tuple[int, int, int] | None,
               now: bool) -> None:
        """An `editor.change` (a person's ends an `abort` run: rarely then). One sent
        again under the key of an edit the run applied (its sender was told
        `unavailable` after) changes nothing and logs nothing."""
        if origin == "user" and self.state.on_edit == "abort" and not now:
            return
        event = DocumentEdited("bob", origin, 7, None,  # type: ignore[arg-type]
                               None if change is None else (change,), key)
        kept = None if key is None else sender_key("bob", key)
        if kept is not None and kept in self.state.edit_keys:
            decision = MACHINE.decide(self.state, event)
            assert decision.state == self.state and not decision.effects, \
                "an edit sent again was applied again"
        before = self.state
        self.apply(event)
        if key is not None and not before.finished and not self.state.finished:
            assert kept in self.state.edit_keys, "an applied edit's key was not kept"

    @rule(now=RARELY)
    def crashed(self, now: bool) -> None:
        if now:
            self.apply(Crashed("bug"))

    @rule()
    def backend_fails_next_publish(self) -> None:
        self.fail_next_publish = True

    # -- invariants -------------------------------------------------------------------
    @invariant()
    def a_stale_timer_fire_changes_nothing(self) -> None:
        """A timer can fire while the decision that disarms it is being committed (a
        shared backend's publish takes a while); its fire is then applied right after
        that decision, and must change nothing, whatever the decision armed since (an
        approved call's tool timer, say). Checked for every timer the last decision
        disarmed, without applying it. The grace timer is left out: it measures the
        executor's absence, which goes on across calls."""
        for key in sorted(self.just_disarmed - {"grace"}):
            decision = MACHINE.decide(self.state, TimerFired(key))
            assert decision.state == self.state, f"the stale fire of {key!r} changed the run"
            assert not any(isinstance(e, Publish) for e in decision.effects), \
                f"the stale fire of {key!r} logged events"

    @invariant()
    def one_finish_and_nothing_after_it(self) -> None:
        finishes = [i for i, e in enumerate(self.log) if isinstance(e, RunFinished)]
        assert len(finishes) <= 1
        if self.state.finished and not self.lost_lease:
            assert len(finishes) == 1 and finishes[0] == len(self.log) - 1
            assert self.released == 1, "the document must be released exactly once"
        if not self.state.finished:
            assert not finishes and self.released == 0

    @invariant()
    def an_absent_executor_is_given_a_grace_that_ends_the_wait(self) -> None:
        """Without it a call waited out its whole deadline for a client long gone (after
        a takeover from a checkpoint the grace used not to be armed again)."""
        if not self.state.finished and self.state.waiting_on_executor \
                and not self.state.executor_present:
            assert "grace" in self.timers, "nothing ends a wait on an absent executor"

    @invariant()
    def nothing_pending_after_the_end(self) -> None:
        if self.state.finished:
            assert self.state.current is None and not self.state.queue
            assert not self.timers and not self.model_busy and self.tool_busy is None

    @invariant()
    def every_call_dispatched_once_and_settled_once(self) -> None:
        dispatched = [e.call_id for e in self.log if isinstance(e, ToolCall)]
        assert len(dispatched) == len(set(dispatched)), "a tool.call was sent twice"
        done = [e.call_id for e in self.log if isinstance(e, ToolDone)]
        assert len(done) == len(set(done)), "a call got two tool.done"
        announced = set(dispatched) | {e.call_id for e in self.log
                                       if isinstance(e, ApprovalRequested)}
        assert set(done) <= announced
        if self.state.finished and not self.lost_lease:
            assert set(done) == announced, "an announced call never ended"

    @invariant()
    def status_only_moves_forward(self) -> None:
        ranks = [STATUS_RANK[s] for s in self.statuses]
        assert ranks == sorted(ranks)
        if self.state.finished:
            assert self.state.status in ("completed", "cancelled", "aborted", "failed",
                                         "timed_out")

    @invariant()
    def waiting_status_matches_the_pending_call(self) -> None:
        state = self.state
        if state.finished:
            return
        waiting = state.status in ("waiting_tool", "waiting_approval")
        assert waiting == state.waiting_on_executor
        assert state.step <= state.max_steps or state.phase != "model"
        if state.current is not None and state.current.kind == "tool" and \
                state.current.executor == "client":
            assert f"call:{state.current.call_id}" in self.timers

    @invariant()
    def replies_never_carry_exception_text(self) -> None:
        for reply in self.replies:
            text = reply.to_json().decode()
            assert "Traceback" not in text and "Error(" not in text


RunLifecycle.TestCase.settings = settings(
    max_examples=1500, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
test_run_lifecycle = RunLifecycle.TestCase


def test_a_refused_result_can_be_retried() -> None:
    """Regression shape: a result whose tool.done could not be logged stays acceptable."""
    machine = RunLifecycle()
    machine.begin(json_tools=False, max_steps=3, begin_fails=False)
    machine.model_finishes("", [("read", True, "ok")], False)
    call = machine.state.current
    assert call is not None and call.token
    machine.apply(ClientToolResult(call.call_id, call.token, ToolOutcome("ok", output=1),
                                   "alice", 2000, "r"), fail=True)
    assert machine.state.current == call and not any(isinstance(e, ToolDone) for e in machine.log)
    machine.apply(ClientToolResult(call.call_id, call.token, ToolOutcome("ok", output=1),
                                   "alice", 2000, "r"))
    assert [e.status for e in machine.log if isinstance(e, ToolDone)] == ["ok"]
    assert replace(machine.state).current is None


def test_a_call_after_a_server_tool_gets_a_deadline_from_when_the_tool_finished() -> None:
    """A client call (or approval) queued behind a server tool in the same turn was
    opened as of time 0: its token expired in 1970 and could never be answered."""
    for second, timeout_ms in (("read", 60_000), ("edit", 300_000)):
        machine = RunLifecycle()
        machine.begin(json_tools=False, max_steps=3, begin_fails=False)
        machine.model_finishes("", [("stats", True, "ok"), (second, True, "ok")], False)
        assert machine.tool_busy is not None
        machine.server_tool_finishes(ok=True, at_ms=1_795_000_000_000)
        opened = machine.state.current
        assert opened is not None and opened.name == second
        assert opened.expires_at == 1_795_000_000_000 + timeout_ms
