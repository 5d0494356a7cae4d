"""Fast paths of the inbound side checked against the general code. A run's input
applied in its sender's task (`RunDriver.submit` taking the idle
driver's turn, `RunInbox`) gives exactly what the driver's own task gave: the same
frames to the client, in the same order, whether the turn completes at once, waits
half-way (its rest finishes in a task of the run), or fails. A message validated by
its type's own model is the one the discriminated union gives."""

import asyncio
import itertools
import re
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import pytest
from pydantic import ValidationError

from protocol.client import CLIENT_MESSAGE_ADAPTER, CLIENT_MESSAGE_TYPES
from protocol.parsing import _VALIDATORS, validate_message
from server.agent.driver import RunDriver
from server.agent.steps import ClientToolResult, Input
from server.connection import Peer
from server.inbox import Envelope, RunInbox
from server.session import DocumentSession
from tests.harness import Client, joined, running_server
from tests.runs import answer, call, script, start

_IDS = {"run_id", "token", "call_id", "epoch", "message_id", "session_id", "connection_id"}
_TIMES = {"ts", "expires_at", "started_at", "finished_at", "duration_ms", "elapsed_ms"}


def _normalized(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The frames with their random values renamed consistently (the first run id
    seen becomes <run_id 0>...) and their times blanked, so that two runs of a
    scenario compare equal."""
    names: dict[tuple[str, Any], str] = {}
    counters: dict[str, itertools.count[int]] = {}

    def rename(key: str, value: Any) -> Any:
        if isinstance(value, dict):
            return {k: rename(k, v) for k, v in value.items()}
        if isinstance(value, list):
            return [rename(key, v) for v in value]
        if key in _TIMES and value is not None:
            return "<time>"
        if key in _IDS and value is not None:
            counter = counters.setdefault(key, itertools.count())
            return names.setdefault((key, value), f"<{key} {next(counter)}>")
        if key == "message" and isinstance(value, str):  # ids quoted, refs of errors
            return re.sub(r"run_[0-9a-f]{8,}|\(ref [0-9a-f]+\)", "<id>", value)
        return value

    return [rename("", event) for event in events]


def _reply_to(message_id: str) -> Callable[[dict[str, Any]], bool]:
    return lambda event: event.get("reply_to") == message_id


async def _scenario(client: Client, calls: int) -> None:
    """Tool round trips, with refusals and a duplicate on the way, then a cancel."""
    ack = await start(client, script(*[{"tool_calls": [call("read_document")]}] * calls,
                                     {"say": "done"}))
    for index in range(calls):
        tool_call = await client.recv_until("tool.call")
        if index == 1:
            await answer(client, {**tool_call, "token": tool_call["token"][:-4] + "AAAA"}, 1,
                         id="bad")
            await client.recv_until(_reply_to("bad"))
            await client.send({"type": "tool.result", "id": "np", "run_id": ack["run_id"],
                               "call_id": "nope", "token": tool_call["token"], "output": 1})
            await client.recv_until(_reply_to("np"))
        await answer(client, tool_call, {"text": f"doc {index}"}, id=f"r{index}")
        await client.recv_until(_reply_to(f"r{index}"))
        if index == 0:
            await answer(client, tool_call, {"text": "again"}, id="dup")
            await client.recv_until(_reply_to("dup"))
    await client.recv_until("run.finished")
    await client.send({"type": "run.cancel", "id": "late", "run_id": ack["run_id"]})
    await client.recv_until(_reply_to("late"))
    await client.send({"type": "ping", "id": "p", "ts": 1})
    await client.recv_until("pong")


async def _frames(monkeypatch: pytest.MonkeyPatch, eager: bool, calls: int = 4,
                  scenario: Callable[[Client, int], Awaitable[None]] = _scenario
                  ) -> tuple[list[dict[str, Any]], int]:
    """What the client received, and how many inputs took the sender's turn."""
    turns = 0
    take_turn = RunInbox.take_turn

    def counted(inbox: RunInbox, *args: Any) -> bool:
        nonlocal turns
        taken = eager and take_turn(inbox, *args)
        turns += taken
        return taken

    with monkeypatch.context() as patch:
        patch.setattr(RunInbox, "take_turn", counted)
        async with running_server() as server, joined(server) as (client, _):
            await scenario(client, calls)
    return _normalized(client.events), turns


async def test_a_senders_turn_sends_what_the_drivers_task_sent(
        monkeypatch: pytest.MonkeyPatch) -> None:
    general, no_turns = await _frames(monkeypatch, eager=False)
    fast, turns = await _frames(monkeypatch, eager=True)
    assert no_turns == 0 and turns >= 4  # every accepted result, and the refused ones
    assert [e["type"] for e in fast].count("tool.call") == 4
    assert fast == general


async def test_a_turn_that_waits_is_finished_by_the_run_in_order(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The first application waits (as a publish to a busy writer would): the rest
    of the turn runs in a task of the run, and inputs arriving meanwhile queue."""
    apply = RunDriver._apply

    async def waiting(driver: RunDriver, event: Input, peer: Peer | None,
                      sent: Envelope | None = None) -> bool:
        if isinstance(event, ClientToolResult):
            await asyncio.sleep(0)
            await asyncio.sleep(0)
        return await apply(driver, event, peer, sent)

    general, _ = await _frames(monkeypatch, eager=False)
    monkeypatch.setattr(RunDriver, "_apply", waiting)
    fast, turns = await _frames(monkeypatch, eager=True)
    assert turns >= 4 and fast == general


async def test_a_decision_logged_at_once_sends_what_publish_many_sent(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A round trip's decision whose events are encoded already is logged by a plain
    call (`DocumentSession.publish_now`, `CommitMixin._logged_now`): the client gets the
    same frames as when every decision goes through `publish_many`, refusals included."""
    taken = 0
    publish_now = DocumentSession.publish_now

    def counted(session: DocumentSession, events: Any) -> bool:
        nonlocal taken
        done = publish_now(session, events)
        taken += done
        return done

    monkeypatch.setattr(DocumentSession, "publish_now", lambda session, events: False)
    general, _ = await _frames(monkeypatch, eager=True)
    assert taken == 0
    monkeypatch.setattr(DocumentSession, "publish_now", counted)
    fast, _ = await _frames(monkeypatch, eager=True)
    assert taken >= 8  # each accepted result's `tool.done` and each `tool.call`
    assert fast == general


async def _failing_scenario(client: Client, calls: int) -> None:
    ack = await start(client, script({"tool_calls": [call("read_document")]}, {"say": "x"}))
    tool_call = await client.recv_until("tool.call")
    await answer(client, tool_call, {"text": "boom"}, id="boom")
    finished = await client.recv_until("run.finished")
    assert finished["run_id"] == ack["run_id"] and finished["status"] == "failed"
    await client.recv_until(_reply_to("boom"))  # answered, not stuck
    await client.send({"type": "ping", "id": "p", "ts": 1})
    await client.recv_until("pong")


async def test_a_turn_that_fails_ends_the_run_as_a_failing_driver_did(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug escaping the application (not the machine's: that one is answered) ends
    the run through the driver's last resort, and its sender is answered."""
    execute = RunDriver._execute

    async def failing(driver: RunDriver, decision: Any, peer: Peer | None) -> bool:
        if peer is not None and decision.reply_to == "boom":
            raise RuntimeError("injected")
        return await execute(driver, decision, peer)

    monkeypatch.setattr(RunDriver, "_execute", failing)
    general, _ = await _frames(monkeypatch, eager=False, scenario=_failing_scenario)
    fast, turns = await _frames(monkeypatch, eager=True, scenario=_failing_scenario)
    assert turns == 1 and fast == general


async def test_run_inbox_keeps_the_consumer_parked_during_a_turn() -> None:
    applied: list[str] = []
    gate = asyncio.get_running_loop().create_future()

    async def settle(envelope: Envelope) -> None:
        if envelope.event == "slow":
            await gate
        applied.append(envelope.event)
        envelope.settle(True)

    inbox = RunInbox(settle, lambda: "end" not in applied)
    tasks: set[asyncio.Task[None]] = set()

    def spawn(coroutine: Coroutine[Any, Any, None]) -> "asyncio.Task[None]":
        task = asyncio.create_task(coroutine)
        tasks.add(task)
        return task

    assert not inbox.take_turn(Envelope("early", None), spawn)  # the consumer is not parked
    parked = asyncio.ensure_future(inbox.park())
    await asyncio.sleep(0)
    fast = Envelope("fast", None)
    assert inbox.take_turn(fast, spawn) and fast.answer is True and not tasks
    assert not parked.done()  # nothing for it: it stays parked
    assert inbox.take_turn(Envelope("slow", None), spawn) and len(tasks) == 1
    assert not inbox.take_turn(Envelope("other", None), spawn)  # one turn at a time
    inbox.put_nowait(Envelope("queued", None))
    await asyncio.sleep(0)
    assert not parked.done()  # the turn applies it, not the consumer
    gate.set_result(None)
    await asyncio.gather(*tasks)
    assert applied == ["fast", "slow", "queued"] and not parked.done()
    inbox.put_nowait(Envelope("end", None))
    await parked  # woken by an item when no turn runs
    assert inbox.get_nowait().event == "end"


_BASES: list[dict[str, Any]] = [
    {"type": "hello", "protocol": 1, "client_id": "tab", "token": "t",
     "resume": {"epoch": "e", "after_seq": 3}},
    {"type": "run.start", "id": "s", "prompt": "p", "run_id": "r",
     "tools": [{"name": "read", "parameters": {"type": "object"}}],
     "options": {"max_steps": 3, "if_busy": "enqueue"}, "thread_id": "main"},
    {"type": "tool.result", "id": "i", "run_id": "r", "call_id": "c", "token": "t",
     "output": {"text": "doc"}, "document_version": 4},
    {"type": "tool.result", "run_id": "r", "call_id": "c", "token": "t",
     "error": {"message": "m", "code": "x"}},
    {"type": "approval", "run_id": "r", "call_id": "c", "decision": "approve",
     "scope": "run", "arguments": {"a": 1}, "reason": "ok"},
    {"type": "auth.refresh", "id": "a", "token": "t"},
    {"type": "run.cancel", "run_id": "r", "reason": "no"},
    {"type": "editor.change", "document_version": "v2", "origin": "agent", "summary": "s",
     "changes": [{"from": 1, "to": 2, "insert": 3}, {"from": 5, "to": 4, "insert": 0}]},
    {"type": "ping", "ts": 1.5},
]
_ODD_VALUES: list[Any] = [None, 0, -1, 1.5, True, "", "x" * 65, "y" * 129, "main", [], {},
                          [{"from": 1}], {"message": 1}, "approve", "call", 2**63]


def _variants() -> list[dict[str, Any]]:
    """The valid messages, each with every field removed, replaced by odd values,
    and with an unknown field: valid and invalid ones of every type."""
    out: list[dict[str, Any]] = []
    for base in _BASES:
        out.append(base)
        out.append({**base, "unknown": 1})
        for key in base:
            if key != "type":
                out.append({k: v for k, v in base.items() if k != key})
                out.extend({**base, key: value} for value in _ODD_VALUES)
        out.extend({**base, "output": value} for value in (None, 1))  # both outcomes
    return out


def test_each_types_validator_is_the_unions() -> None:
    assert set(_VALIDATORS) == CLIENT_MESSAGE_TYPES
    accepted = refused = 0
    for data in _variants():
        try:
            expected: Any = CLIENT_MESSAGE_ADAPTER.validate_python(data, strict=True)
        except ValidationError:
            expected = None
        try:
            got: Any = _VALIDATORS[data["type"]].validate_python(data, strict=True)
        except ValidationError:
            got = None
        if expected is None:
            refused += 1
            assert got is None, data
        else:
            accepted += 1
            assert type(got) is type(expected) and got == expected, data
            assert got.model_fields_set == expected.model_fields_set, data
            assert validate_message(data) == expected
    assert accepted > 50 and refused > 100

