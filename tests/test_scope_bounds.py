"""Edit scopes at their bounds, over real sockets (PROTOCOL.md section 11).

- Offsets each inside the accepted range whose sum is not: the shifted scope held
  integers no JavaScript client reads exactly (past 2**53) or, past 2**64, that the
  event log cannot write: the run ended `failed`/`internal_error` (ERROR "an event of
  the run cannot be logged"), even for the run's own edit, which never ends a run. A
  person's edit that would push the scope past `MAX_OFFSET` now overlaps it; the run's
  own makes the scope the whole document.
- A run on the whole document (`on_edit: overlap`, no scope) was aborted by an
  `editor.change` with an empty `changes` list or only no-op changes, which a scoped
  run ignores and `scope.edit_overlaps` and the JS client call no overlap. A missing
  `changes` still overlaps everything (section 11).
"""

from collections.abc import AsyncIterator
from typing import Any

import pytest

from protocol import base
from server.agent import scope
from tests.harness import Client, Server, joined, logged, running_server
from tests.runs import answer, call, of_run, script, start

MAX = scope.MAX_OFFSET
WAITS_ON_TOOLS = script({"tool_calls": [call("read_document")]},
                        {"tool_calls": [call("read_document")]}, {"say": "done"})
DOCUMENT = {"text": "0123456789" * 4, "version": 1}


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    async with running_server() as srv:
        yield srv


async def begin(client: Client, scope_: list[dict[str, int]] | None) -> dict[str, Any]:
    context: dict[str, Any] = {"document": DOCUMENT}
    if scope_ is not None:
        context["scope"] = scope_
    ack = await start(client, WAITS_ON_TOOLS, context=context, options={"on_edit": "overlap"})
    ack["pending"] = await client.recv_until("tool.call")
    return ack


async def edit(client: Client, version: int, changes: list[tuple[int, int, int]] | None,
               origin: str = "user") -> dict[str, Any]:
    """An editor.change; returns its reply (`ack` or `error`) once it has been judged."""
    message: dict[str, Any] = {"type": "editor.change", "id": f"e{version}",
                               "document_version": version, "origin": origin}
    if changes is not None:
        message["changes"] = [{"from": f, "to": t, "insert": i} for f, t, i in changes]
    await client.send(message)
    reply = await client.recv_until(lambda e: e.get("reply_to") == f"e{version}")
    await client.recv_until(lambda e: e.get("type") == "document.changed"
                            and e.get("document_version") == version)
    return reply


async def finish(client: Client, ack: dict[str, Any]) -> dict[str, Any]:
    run_id, pending = ack["run_id"], ack["pending"]
    while True:
        await answer(client, pending, {"text": "doc"})
        pending = await client.recv_until(lambda e: e.get("run_id") == run_id and e.get("type")
                                          in ("tool.call", "run.finished"))
        if pending["type"] == "run.finished":
            return pending


def finished(client: Client, run_id: str) -> list[tuple[str, str | None]]:
    return [(e["status"], e.get("reason")) for e in of_run(client.events, run_id, "run.finished")]


def scopes(client: Client, run_id: str) -> list[list[dict[str, int]]]:
    return [e["scope"] for e in of_run(client.events, run_id, "run.scope")]


def test_the_wire_bound_is_the_scope_arithmetics() -> None:
    assert base.MAX_OFFSET == scope.MAX_OFFSET == 2**53 - 1


async def test_a_persons_edit_pushing_the_scope_past_the_bound_aborts_the_run(
        server: Server) -> None:
    async with joined(server) as (alice, _):
        with logged("cowrite", 40) as errors:  # ERROR and above
            ack = await begin(alice, [{"from": 10, "to": 20}])
            await edit(alice, 2, [(0, 0, MAX), (0, 0, MAX)])
            end = await alice.recv_until("run.finished")
        assert end["run_id"] == ack["run_id"]
        assert (end["status"], end["reason"]) == ("aborted", "document_changed")
        assert scopes(alice, ack["run_id"]) == [] and errors == []
        # the last unit it may reach: still followed
        ack = await begin(alice, [{"from": 10, "to": 20}])
        await edit(alice, 3, [(0, 0, MAX - 20)])
        assert finished(alice, ack["run_id"]) == []
        assert scopes(alice, ack["run_id"]) == [[{"from": MAX - 10, "to": MAX}]]
        assert (await finish(alice, ack))["status"] == "completed"


async def test_the_runs_own_edit_past_the_bound_makes_its_scope_the_whole_document(
        server: Server) -> None:
    async with joined(server) as (alice, _):
        with logged("cowrite", 40) as errors:
            ack = await begin(alice, [{"from": 10, "to": 20}])
            reply = await edit(alice, 2, [(0, 0, MAX), (15, 15, MAX)], origin="agent")
            assert reply["type"] == "ack"
            await edit(alice, 3, [(50, 50, 1)], origin="agent")  # not shifted any more
            assert finished(alice, ack["run_id"]) == [], "the run's own edit never ends it"
            assert scopes(alice, ack["run_id"]) == [] and errors == []
            # the whole document: a person's edit anywhere now overlaps it
            await edit(alice, 4, [(0, 0, 1)])
            end = await alice.recv_until("run.finished")
        assert (end["status"], end["reason"]) == ("aborted", "document_changed")


@pytest.mark.parametrize("changes", [[], [(5, 5, 0)], [(5, 5, 0), (0, 0, 0)]],
                         ids=["empty", "noop", "noops"])
@pytest.mark.parametrize("ranges", [None, [{"from": 0, "to": 40}]],
                         ids=["whole-document", "scoped"])
async def test_an_edit_that_changed_nothing_overlaps_no_scope(
        server: Server, changes: list[tuple[int, int, int]],
        ranges: list[dict[str, int]] | None) -> None:
    async with joined(server) as (alice, _):
        ack = await begin(alice, ranges)
        await edit(alice, 2, changes)
        assert finished(alice, ack["run_id"]) == []
        end = await finish(alice, ack)
        assert end["status"] == "completed"


@pytest.mark.parametrize("changes", [None, [(5, 5, 0), (39, 40, 0)], [(40, 40, 1)]],
                         ids=["missing", "a-deletion", "an-insertion-at-the-end"])
async def test_a_whole_document_run_is_still_aborted_by_any_real_change(
        server: Server, changes: list[tuple[int, int, int]] | None) -> None:
    async with joined(server) as (alice, _):
        ack = await begin(alice, None)
        await edit(alice, 2, changes)
        end = await alice.recv_until("run.finished")
        assert end["run_id"] == ack["run_id"]
        assert (end["status"], end["reason"]) == ("aborted", "document_changed")


@pytest.mark.parametrize("where", ["scope", "change"])
async def test_an_offset_past_the_bound_is_refused_and_loses_nothing(
        server: Server, where: str) -> None:
    """Past MAX_OFFSET (up to the frame's 64-bit limit) an offset was accepted, and the
    sum of two ended the run `failed`/`internal_error`; now it is `invalid_message`
    naming the field, and the run and the document go on."""
    async with joined(server) as (alice, _):
        if where == "scope":
            await alice.send({"type": "run.start", "id": "s", "prompt": WAITS_ON_TOOLS,
                              "context": {"scope": [{"from": 0, "to": MAX + 1}]}})
            refused = await alice.recv_until(lambda e: e.get("reply_to") == "s")
            assert refused["type"] == "error" and refused["code"] == "invalid_message"
            assert refused["details"][0]["loc"] == ["context", "scope", 0, "to"]
            ack = await begin(alice, [{"from": 0, "to": MAX}])
        else:
            ack = await begin(alice, [{"from": 10, "to": 20}])
            await alice.send({"type": "editor.change", "id": "big", "document_version": 2,
                              "changes": [{"from": 0, "to": 0, "insert": 2**63 - 1}]})
            refused = await alice.recv_until(lambda e: e.get("reply_to") == "big")
            assert refused["type"] == "error" and refused["code"] == "invalid_message"
            assert refused["details"][0]["loc"] == ["changes", 0, "insert"]
            assert str(2**63 - 1) not in refused["message"]
        assert finished(alice, ack["run_id"]) == []
        assert (await finish(alice, ack))["status"] == "completed"


def test_a_person_typing_through_a_long_wait_leaves_a_bounded_note() -> None:
    """Every edit the run survived added a note, each checkpointed whole with all the
    notes before it (200 edits: 2 MB of Redis writes, growing with their square) and
    all of them told to the model. The newest NOTES_KEPT are kept, the rest counted."""
    from server.agent.checkpoint import to_checkpoint
    from server.agent.edits import NOTES_KEPT, changes_note, judge_edit
    from server.agent.run_state import RunState

    state = RunState(run_id="r1", document_id="d1", mode="agent", user_id="alice",
                     client_id="tab", prompt="p", model="m", max_steps=5, on_edit="continue",
                     messages=({"role": "user", "content": "p"},))
    sizes = []
    for version in range(2, 502):
        verdict = judge_edit(state, "bob", "user", version, "typing", ((0, 0, 1),))
        assert not verdict.abort
        state = verdict.state
        sizes.append(len(str(to_checkpoint(state))))
    assert len(state.edits) == NOTES_KEPT and state.document_version == 501
    assert sizes[-1] == sizes[-100]  # the checkpoint stopped growing
    told = changes_note(state.edits).splitlines()
    assert told[1] == f"- {500 - NOTES_KEPT + 1} earlier edits (not listed)"
    assert told[-2].startswith("- bob (document version 501): typing")
