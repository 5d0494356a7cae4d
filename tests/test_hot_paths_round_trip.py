"""The round trip's decisions written out (`server/agent/round_trip.py`) decide exactly
as the general machine does: the same state, effects (in order), reply and
refusability, for random states and inputs; they are taken in the usual case and
leave every other case to the general code."""

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server.agent import round_trip
from server.agent.edits import edit_note
from server.agent.machine import RunMachine
from server.agent.run_state import ModelCall, PendingCall, RunState, ToolOutcome
from server.agent.steps import (
    ClientToolResult,
    Decision,
    Input,
    MachineConfig,
    ModelFinished,
    Publish,
)
from server.auth import Authenticator, CallGrant
from server.settings import Settings
from tests import test_machine_properties as properties

AUTH = Authenticator(Settings(jwt_secret="round-trip-secret-0123456789abcdef"))
CONFIG = MachineConfig(signer=AUTH, tool_timeout_s=60, approval_timeout_s=300,
                       run_timeout_s=600, client_grace_s=30)
MACHINE = RunMachine(CONFIG)
EXPIRES = 1_000_000


def general(machine: RunMachine, state: RunState, event: Input) -> Decision:
    """`machine.decide` without the written-out decisions."""
    saved = dict(round_trip.WHOLE)
    round_trip.WHOLE.clear()
    try:
        return machine.decide(state, event)
    finally:
        round_trip.WHOLE.update(saved)


def same_decision(machine: RunMachine, state: RunState, event: Input) -> bool:
    """Both ways decide alike; True when the written-out decision was taken."""
    whole = round_trip.WHOLE.get(type(event))
    taken = whole is not None and whole(machine.config, state, event) is not None
    expected, got = general(machine, state, event), machine.decide(state, event)
    assert got == expected
    assert [type(effect) for effect in got.effects] == \
        [type(effect) for effect in expected.effects]
    for mine, theirs in zip(got.effects, expected.effects, strict=True):
        if isinstance(mine, Publish) and isinstance(theirs, Publish):  # the log's bytes
            assert [e.to_json() for e in mine.events] == [e.to_json() for e in theirs.events]
    assert got.state.to_record("x") == expected.state.to_record("x")
    return taken


def _token(call_id: str, user: str = "alice", expires: int = EXPIRES) -> str:
    return AUTH.issue_call_token(CallGrant("r1", call_id, user, "d1", expires))


VERSIONS = st.none() | st.integers(-3, 3) | st.sampled_from(["v1", "v2"])
# Integers within 64 bits, as the edge admits them (`decode_frame`): one beyond could not
# be encoded either way, and comparing the bytes raised (tests/test_hot_paths_wire_events.py
# covers such values: the written-out decision leaves them to the general code).
INT64 = st.integers(-2**63, 2**63 - 1)
OUTPUTS = st.none() | INT64 | st.text(max_size=5) | st.dictionaries(
    st.text(max_size=3), INT64 | st.text(max_size=3), max_size=2)
OUTCOMES = st.builds(ToolOutcome, st.sampled_from(["ok", "error", "rejected", "timeout"]),
                     OUTPUTS, st.none() | st.sampled_from(
                         [{"message": "m"}, {"code": "stale", "message": "old"},
                          {"code": "other"}]))
EDITS = st.sampled_from([(), (edit_note("bob", 2, "s", ((0, 1, 2),)),)])
QUEUED = st.sampled_from([(), (ModelCall("q1", "read", "{}", {}),)])


@settings(max_examples=600, deadline=None)
@given(json_tools=st.booleans(), present=st.booleans(), edits=EDITS, queue=QUEUED,
       terminate=st.booleans(), known=VERSIONS, reported=VERSIONS, outcome=OUTCOMES,
       kind=st.sampled_from(["tool", "tool", "approval"]),
       executor=st.sampled_from(["client", "client", "server"]),
       which=st.sampled_from(["c1", "c1", "c2"]), held_token=st.booleans(),
       token=st.sampled_from(["issued", "issued", "other user", "bad", "other call"]),
       user=st.sampled_from(["alice", "alice", "bob"]),
       at_ms=st.sampled_from([0, EXPIRES, EXPIRES + 1]), step=st.integers(0, 4),
       checkpoint_steps=st.booleans())
def test_a_client_result_is_decided_as_the_machine_decides_it(
        json_tools: bool, present: bool, edits: Any, queue: Any, terminate: bool,
        known: Any, reported: Any, outcome: ToolOutcome, kind: Any, executor: Any,
        which: str, held_token: bool, token: str, user: str, at_ms: int, step: int,
        checkpoint_steps: bool) -> None:
    machine = RunMachine(MachineConfig(AUTH, 60, 300, 600, 30, checkpoint_steps))
    issued = _token("c1")
    current = PendingCall("c1", "read", {}, kind, executor, EXPIRES, issued if held_token else None)
    state = properties.new_state(json_tools, 5).evolve(
        phase="tools", status="waiting_tool", step=step, current=current, edits=edits,
        queue=queue, terminate_after_tools=terminate, document_version=known,
        executor_present=present, messages=({"role": "user", "content": "p"},),
        completed_calls=frozenset({"c0"}), call_ids=frozenset({"c0", "c1"}))
    sent = {"issued": issued, "other user": _token("c1", "bob"), "bad": "bad",
            "other call": _token("c2")}[token]
    event = ClientToolResult(which, sent, outcome, user, at_ms, "q", reported)
    taken = same_decision(machine, state, event)
    usual = which == "c1" and kind == "tool" and executor == "client" and held_token \
        and token == "issued" and user == "alice" and at_ms <= EXPIRES and not edits \
        and not queue and not terminate
    assert taken == usual


CALLS = st.lists(st.builds(
    lambda call_id, name, valid, executor, approval: ModelCall(
        call_id, name, "{}", {} if valid else None, executor, approval,
        None if valid else "invalid"),
    st.sampled_from(["", "c1", "c0", "fresh", "x" * 70]), st.sampled_from(["read", "edit"]),
    st.booleans() | st.just(True), st.sampled_from(["client", "client", "server"]),
    st.booleans()), max_size=3)


@settings(max_examples=600, deadline=None)
@given(json_tools=st.booleans(), present=st.booleans(), calls=CALLS,
       text=st.sampled_from(["", "", "hi"]), usage=st.sampled_from(
           [(), (("total_tokens", 3),), (("prompt_tokens", 2), ("total_tokens", 5))]),
       earlier=st.sampled_from([(), (("total_tokens", 4),)]), terminate=st.booleans(),
       approved=st.sampled_from([frozenset(), frozenset({"edit"})]), step=st.integers(1, 5),
       phase=st.sampled_from(["model", "model", "tools"]),
       mode=st.sampled_from(["agent", "agent", "chat"]), version=VERSIONS,
       at_ms=st.integers(0, 2_000_000))
def test_a_model_turn_is_decided_as_the_machine_decides_it(
        json_tools: bool, present: bool, calls: list[ModelCall], text: str, usage: Any,
        earlier: Any, terminate: bool, approved: Any, step: int, phase: Any, mode: Any,
        version: Any, at_ms: int) -> None:
    state = properties.new_state(json_tools, 4).evolve(
        phase=phase, mode=mode, step=step, message_id=f"r1:m{step}", usage=earlier,
        approved_names=approved, executor_present=present, document_version=version,
        call_ids=frozenset({"c0"}), messages=({"role": "user", "content": "p"},))
    event = ModelFinished(text, tuple(calls), usage, terminate=terminate, at_ms=at_ms)
    taken = same_decision(MACHINE, state, event)
    first = calls[0] if calls else None
    usual = first is not None and phase == "model" and mode == "agent" and not text \
        and step < 4 and first.arguments is not None and first.executor == "client" \
        and (not first.requires_approval or first.name in approved)
    assert taken == usual


class BothWays(properties.RunLifecycle):
    """The machine's property test, every decision also taken the general way (the
    written-out ones are rare there: its turns mostly say something or end the run)."""

    def apply(self, event: Input, fail: bool = False) -> None:
        same_decision(properties.MACHINE, self.state, event)
        super().apply(event, fail)


BothWays.TestCase.settings = settings(
    max_examples=150, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
test_both_ways_over_random_runs = BothWays.TestCase


def test_a_round_trip_takes_both() -> None:
    state = properties.new_state(False, 5).evolve(phase="model", step=1, message_id="r1:m1")
    turn = ModelFinished("", (ModelCall("c1", "read", "{}", {}),), at_ms=1000)
    assert same_decision(MACHINE, state, turn)
    state = MACHINE.decide(state, turn).state
    current = state.current
    assert current is not None and current.token is not None
    result = ClientToolResult("c1", current.token, ToolOutcome("ok", {"text": "doc"}), "alice",
                              2000, "q", 7)
    assert same_decision(MACHINE, state, result)
