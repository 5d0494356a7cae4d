"""The round trip's events built as wire dicts (`server/agent/wire_events.py`) are the
models' bytes: for random values, awkward ones included (floats that are not numbers,
integers past 64 bits, non-string keys, tuples, sets, bytes, datetimes, subclasses of
str), a `WireEvent` encodes as the model does, for the log, the wire and a shared log,
or is refused (None) and the written-out decision leaves the input to the general
machine, which then decides as before."""

import datetime
import enum
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from protocol.server import Ack, ToolCall, ToolDone
from server.agent import round_trip
from server.agent.run_state import ModelCall, PendingCall, ToolOutcome
from server.agent.steps import ClientToolResult, ModelFinished, Publish, Reply
from server.agent.wire_events import WireEvent, wire_event
from server.auth import CallGrant
from server.session import _encoded
from tests import test_machine_properties as properties
from tests.test_hot_paths_round_trip import AUTH, EXPIRES, MACHINE, general


class Label(str):
    """A subclass of str: the models' serializer makes it a str, orjson would too, but
    only by luck; it is refused."""


class Colour(enum.Enum):
    RED = "red"


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**63 - 1) | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner,
                                                               max_size=3),
    max_leaves=8)
"""What a client's frame or a model's arguments hold once decoded."""
ODD = st.one_of(
    st.integers(2**63, 2**70) | st.integers(-2**70, -2**63 - 1),
    st.tuples(st.integers(), st.text(max_size=2)), st.sets(st.integers(), max_size=2),
    st.binary(max_size=3), st.datetimes(), st.dates(), st.just(Colour.RED),
    st.datetimes(timezones=st.just(datetime.UTC)), st.timedeltas(),
    st.text(max_size=3).map(Label), st.dictionaries(st.integers(), st.integers(), max_size=2),
    st.builds(lambda v: {"k": [v]}, st.datetimes() | st.binary(max_size=2)),
    st.just("\ud800"))
VALUES = JSON | ODD


def _json(model: Any) -> bytes | None:
    try:
        return model.to_json()  # type: ignore[no-any-return]
    except (TypeError, ValueError):  # as `_encoded`: the serializer or orjson refused it
        return None


def same_event(model: type[BaseModel], wire: dict[str, Any], plain: bool) -> None:
    """`wire` built both ways: equal bytes everywhere they go, or refused; never
    refused when its values are `plain` JSON."""
    fast = wire_event(model, wire)
    try:
        slow = model.model_validate(wire)
    except ValidationError:
        return  # the decisions check what the models refuse before building (see below)
    expected = _json(slow)
    if fast is None:
        assert not plain
        return
    assert expected is not None and fast.to_json() == expected == slow.to_json()  # type: ignore[attr-defined]
    assert _encoded(fast) == _encoded(slow)  # type: ignore[arg-type]
    assert orjson.dumps(fast.to_wire()) == orjson.dumps(slow.to_wire())  # type: ignore[attr-defined]
    assert fast == slow and slow == fast and fast.event() == slow
    assert fast.type == slow.type  # type: ignore[attr-defined]
    for name in ("run_id", "call_id", "status", "name", "executor", "reply_to"):
        if name in model.model_fields:
            assert getattr(fast, name) == getattr(slow, name)


@settings(max_examples=400, deadline=None)
@given(output=VALUES, error=st.none() | st.dictionaries(st.text(max_size=3), VALUES, max_size=2),
       status=st.sampled_from(["ok", "error", "rejected"]))
def test_a_tool_done_is_the_models_bytes(output: Any, error: Any, status: str) -> None:
    wire: dict[str, Any] = {"type": "tool.done", "run_id": "r1", "call_id": "c1",
                            "status": status}
    if output is not None:
        wire["output"] = output
    if error is not None:
        wire["error"] = error
    same_event(ToolDone, wire, False)


@settings(max_examples=300, deadline=None)
@given(output=JSON, error=st.none() | st.dictionaries(st.text(max_size=3), JSON, max_size=2))
def test_plain_json_is_never_refused(output: Any, error: Any) -> None:
    wire: dict[str, Any] = {"type": "tool.done", "run_id": "r1", "call_id": "c1",
                            "status": "ok"}
    if output is not None:
        wire["output"] = output
    if error is not None:
        wire["error"] = error
    same_event(ToolDone, wire, True)


@settings(max_examples=300, deadline=None)
@given(arguments=st.dictionaries(st.text(max_size=3), VALUES, max_size=3),
       version=st.none() | st.integers(-3, 3) | st.text(max_size=3),
       client_id=st.none() | st.text(max_size=3), reply_to=st.none() | st.text(max_size=8))
def test_a_tool_call_and_an_ack_are_the_models_bytes(
        arguments: Any, version: Any, client_id: Any, reply_to: Any) -> None:
    wire: dict[str, Any] = {"type": "tool.call", "run_id": "r1", "call_id": "c1",
                            "name": "read", "arguments": arguments, "executor": "client"}
    if client_id is not None:
        wire["client_id"] = client_id
    wire["token"], wire["expires_at"] = "t.k", 5
    if version is not None:
        wire["document_version"] = version
    same_event(ToolCall, wire, False)
    ack: dict[str, Any] = {"type": "ack"} if reply_to is None else {
        "type": "ack", "reply_to": reply_to}
    ack.update(run_id="r1", call_id="c1", status="accepted")
    same_event(Ack, ack, True)


def _decide_both_ways(state: Any, event: Any) -> bool:
    """The decision taken as the machine takes it and the general way: equal, with
    the same bytes logged and sent when both could be encoded; True when written out."""
    whole = round_trip.WHOLE[type(event)]
    taken = whole(MACHINE.config, state, event) is not None
    expected, got = general(MACHINE, state, event), MACHINE.decide(state, event)
    assert got == expected
    for mine, theirs in zip(got.effects, expected.effects, strict=True):
        sent = [(mine.message, theirs.message)] if isinstance(mine, Reply) and \
            isinstance(theirs, Reply) else []
        if isinstance(mine, Publish) and isinstance(theirs, Publish):
            sent = list(zip(mine.events, theirs.events, strict=True))
        for fast, slow in sent:
            assert (type(fast) is WireEvent) == taken
            assert (fast.to_json() if taken else _json(fast)) == _json(slow)
    return taken


@settings(max_examples=400, deadline=None)
@given(output=VALUES, error=st.none() | st.sampled_from(
           [{"code": "stale", "message": "m"}, {1: "x"}, {"k": b"x"}, {"message": "m"}]),
       status=st.sampled_from(["ok", "error", "bogus"]), reply_to=st.none() | st.text(max_size=4))
def test_a_result_with_any_output_is_decided_as_the_machine_decides_it(
        output: Any, error: Any, status: str, reply_to: Any) -> None:
    issued = AUTH.issue_call_token(CallGrant("r1", "c1", "alice", "d1", EXPIRES))
    state = properties.new_state(False, 5).evolve(
        phase="tools", status="waiting_tool", step=1,
        current=PendingCall("c1", "read", {}, "tool", "client", EXPIRES, issued),
        messages=({"role": "user", "content": "p"},), call_ids=frozenset({"c1"}))
    outcome = ToolOutcome(status, output, error)  # type: ignore[arg-type]
    try:
        taken = _decide_both_ways(state, ClientToolResult("c1", issued, outcome, "alice", 0,
                                                           reply_to, None))
    except ValidationError:  # the general machine refuses it too (a bad status or error)
        assert round_trip.client_result(MACHINE.config, state, ClientToolResult(
            "c1", issued, outcome, "alice", 0, reply_to, None)) is None
        return
    if _json(ToolDone(run_id="r1", call_id="c1", status=status, output=output,
                      error=error)) is None:
        assert not taken


@settings(max_examples=400, deadline=None)
@given(arguments=VALUES, version=st.none() | st.integers(-3, 3) | st.text(max_size=3)
       | st.booleans() | st.floats(-3, 3) | st.just(Label("v")),
       at_ms=st.integers(0, 10**6))
def test_a_turn_with_any_arguments_is_decided_as_the_machine_decides_it(
        arguments: Any, version: Any, at_ms: int) -> None:
    state = properties.new_state(False, 4).evolve(
        phase="model", step=1, message_id="r1:m1", document_version=version,
        call_ids=frozenset({"c0"}), messages=({"role": "user", "content": "p"},))
    event = ModelFinished("", (ModelCall("c1", "read", "{}", arguments),), at_ms=at_ms)
    try:
        taken = _decide_both_ways(state, event)
    except ValidationError:  # the general machine refuses it too (arguments not an object)
        assert round_trip.model_finished(MACHINE.config, state, event) is None
        return
    if orjson_plain(arguments) and type(arguments) is dict and \
            type(version) in (int, str, type(None)):
        assert taken


def orjson_plain(value: Any) -> bool:
    """Whether `value` is plain JSON orjson encodes without help (as `JSON` makes)."""
    if value is None or type(value) in (bool, float):
        return True
    if type(value) is str:
        return _encodes(value)
    if type(value) is int:
        return -2**63 <= value < 2**64
    if type(value) is list:
        return all(orjson_plain(item) for item in value)
    if type(value) is dict:
        return all(type(key) is str and _encodes(key) and orjson_plain(item)
                   for key, item in value.items())
    return False


def _encodes(text: str) -> bool:
    try:
        orjson.dumps(text)
        return True
    except TypeError:
        return False


def test_a_round_trip_is_written_out_with_wire_events() -> None:
    """The usual round trip takes the written-out decisions and their `WireEvent`s (so
    the tests above are not all about refusals)."""
    state = properties.new_state(False, 5).evolve(phase="model", step=1, message_id="r1:m1")
    turn = ModelFinished("", (ModelCall("c1", "read", "{}", {}),), at_ms=1000)
    assert _decide_both_ways(state, turn)
    decided = MACHINE.decide(state, turn)
    state = decided.state
    assert state.current is not None and state.current.token is not None
    result = ClientToolResult("c1", state.current.token, ToolOutcome("ok", {"text": "doc"}),
                              "alice", 2000, "q", 7)
    assert _decide_both_ways(state, result)
    kinds = [type(event) for effect in MACHINE.decide(state, result).effects
             for event in (effect.events if isinstance(effect, Publish) else
                           (effect.message,) if isinstance(effect, Reply) else ())]
    assert kinds == [WireEvent, WireEvent]
