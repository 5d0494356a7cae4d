"""Edits of a run that lives on another instance (PROTOCOL.md section 11, section 13):
two cowrite instances (subprocesses) on one real redis-server.

Each edit's change list is in the coordinates the previous edit left, so the run
must see a document's edits in the order they were made, and before a later
`tool.result` from the same tab; the run's own edits (origin `agent`) move and
grow its scope wherever its executor is connected; and a takeover goes on with
the scope the last edit left, not the one of the previous model step.
"""

from typing import Any

import pytest

from tests.cluster_support import (
    FAST_LEASE,
    cluster,
    edits_around_scope,
    join,
    killed,
    scope_after,
)
from tests.harness import Client
from tests.runs import EDITOR_TOOLS, answer, call, script

pytestmark = [pytest.mark.redis, pytest.mark.slow]

TEXT = {"text": "0123456789" * 4, "version": 1}
EDITS = 24


def _edits() -> list[tuple[int, int, int]]:
    """The scope [200, 210) ends at [320, 330); any two applied in the other order hit it."""
    return edits_around_scope(EDITS, 200)


def _scope_after_edits() -> list[dict[str, int]]:
    return scope_after(_edits(), (200, 210))


async def _start(client: Client, run_id: str, scope: list[dict[str, int]],
                 **options: Any) -> dict[str, Any]:
    """Start a run that asks for a tool twice; its first `tool.call`."""
    steps = script({"tool_calls": [call("read_document")]},
                   {"tool_calls": [call("read_document")]}, {"say": "done"})
    await client.send({"type": "run.start", "id": "s", "run_id": run_id, "prompt": steps,
                       "tools": EDITOR_TOOLS, "context": {"document": TEXT, "scope": scope},
                       "options": {"on_edit": "overlap", **options}})
    return await client.recv_until(lambda e: e.get("type") == "tool.call"
                                   and e["run_id"] == run_id)


async def _send_edits(client: Client, origin: str = "user") -> None:
    for version, (start, to, insert) in enumerate(_edits(), start=2):
        await client.send({"type": "editor.change", "document_version": version,
                           "origin": origin,
                           "changes": [{"from": start, "to": to, "insert": insert}]})


async def test_a_persons_edits_forwarded_from_another_instance_are_judged_in_order() -> None:
    # Each forwarded edit used to be sent by a task of its own: they raced on the Redis
    # pool, and the owner judged an edit in the coordinates of an earlier one, which
    # touched the scope, and aborted the run.
    async with cluster() as (_, (one, two)), join(one, client_id="a") as (alice, _), \
            join(two, sub="bob", client_id="b") as (bob, _):
        pending = await _start(alice, "ordered", [{"from": 200, "to": 210}])
        await _send_edits(bob)
        moved = [await alice.recv_until(lambda e: e.get("type") in ("run.scope",
                                                                     "run.finished"))
                 for _ in range(EDITS)]
        assert [e.get("document_version") for e in moved] == list(range(2, EDITS + 2)), \
            moved[-1]
        assert moved[-1]["scope"] == _scope_after_edits()
        await answer(alice, pending, {"text": "doc"})
        again = await alice.recv_until("tool.call")
        assert again["document_version"] == EDITS + 1
        await answer(alice, again, {"text": "doc"})
        finished = await alice.recv_until("run.finished")
        assert finished["status"] == "completed"


async def test_a_tool_result_after_edits_from_the_same_tab_is_applied_after_them() -> None:
    # The tab's edits, then its answer to the pending call, through another instance:
    # the run must see every edit before the answer (the next call carries the version
    # of the last edit; it used to overtake edits sent in the background).
    async with cluster() as (_, (one, two)), join(one, client_id="a") as (alice, _), \
            join(two, client_id="a2") as (other_tab, _):
        pending = await _start(alice, "answered", [{"from": 200, "to": 210}])
        await other_tab.recv_until(lambda e: e.get("type") == "tool.call")
        await _send_edits(other_tab)
        await other_tab.send({"type": "tool.result", "id": "r", "run_id": "answered",
                              "call_id": pending["call_id"], "token": pending["token"],
                              "output": {"text": "doc"}})
        ack = await other_tab.recv_until(lambda e: e.get("reply_to") == "r")
        assert ack["type"] == "ack" and ack["status"] == "accepted", ack
        again = await alice.recv_until(lambda e: e.get("type") == "tool.call"
                                       and e["call_id"] != pending["call_id"])
        assert again["document_version"] == EDITS + 1
        scopes = [e for e in alice.events if e.get("type") == "run.scope"]
        assert [e["document_version"] for e in scopes] == list(range(2, EDITS + 2))
        await answer(alice, again, {"text": "doc"})
        assert (await alice.recv_until("run.finished"))["status"] == "completed"


async def test_the_runs_own_edits_reach_it_from_its_executors_instance() -> None:
    # A queued run starts on the instance where the run before it ended, not on its
    # executor's: the executor's agent edits were dropped there (only a person's were
    # forwarded), so the scope stayed behind the text the run wrote.
    async with cluster() as (_, (one, two)), join(one, sub="bob", client_id="b") as (bob, _), \
            join(two, client_id="a") as (alice, _):
        bobs = await _start(bob, "first", [{"from": 0, "to": 40}])
        await alice.send({"type": "run.start", "id": "q", "run_id": "queued",
                          "prompt": script({"tool_calls": [call("read_document")]},
                                           {"tool_calls": [call("read_document")]},
                                           {"say": "done"}),
                          "tools": EDITOR_TOOLS,
                          "context": {"document": TEXT, "scope": [{"from": 10, "to": 20}]},
                          "options": {"on_edit": "overlap", "if_busy": "enqueue"}})
        assert (await alice.recv_until(lambda e: e.get("reply_to") == "q"))["status"] == \
            "queued"
        await bob.send({"type": "run.cancel", "id": "c", "run_id": "first"})
        await bob.recv_until(lambda e: e.get("type") == "run.finished"
                             and e["run_id"] == "first")
        assert bobs["run_id"] == "first"
        first = await alice.recv_until(lambda e: e.get("type") == "tool.call"
                                       and e["run_id"] == "queued")
        # the run's tool wrote 30 units inside its scope [10, 20)
        await alice.send({"type": "editor.change", "document_version": 2, "origin": "agent",
                          "changes": [{"from": 15, "to": 15, "insert": 30}]})
        grown = await alice.recv_until("run.scope")
        assert (grown["scope"], grown["document_version"]) == ([{"from": 10, "to": 50}], 2)
        await answer(alice, first, {"text": "doc"})
        second = await alice.recv_until(lambda e: e.get("type") == "tool.call"
                                        and e["run_id"] == "queued"
                                        and e["call_id"] != first["call_id"])
        assert second["document_version"] == 2
        # a person types inside the text the run wrote
        await bob.send({"type": "editor.change", "document_version": 3,
                        "changes": [{"from": 40, "to": 41, "insert": 0}]})
        finished = await alice.recv_until(lambda e: e.get("type") == "run.finished"
                                          and e["run_id"] == "queued")
        assert (finished["status"], finished["reason"]) == ("aborted", "document_changed")


async def test_a_takeover_goes_on_with_the_scope_the_last_edit_left() -> None:
    # The edit's new scope was shared only at the lease's next renewal: the survivor
    # judged the next edits against the scope of before (one outside the real scope
    # aborted the run, one inside did not).
    async with cluster(env=FAST_LEASE) as (_, (one, two)), \
            join(two, sub="bob", client_id="b") as (bob, _):
        async with join(one, client_id="a") as (alice, _):
            await _start(alice, "moved", [{"from": 20, "to": 30}])
            await bob.send({"type": "editor.change", "document_version": 2,
                            "changes": [{"from": 0, "to": 0, "insert": 10}]})
            moved = await bob.recv_until("run.scope")
            assert moved["scope"] == [{"from": 30, "to": 40}]
            await killed(one)
        resumed = await bob.recv_until("run.resumed", timeout=20)
        assert resumed["run_id"] == "moved"
        # outside the scope [30, 40) (inside the old [20, 30)): the run goes on
        await bob.send({"type": "editor.change", "document_version": 3,
                        "changes": [{"from": 22, "to": 23, "insert": 0}]})
        after = await bob.recv_until(lambda e: e.get("type") in ("run.scope", "run.finished"))
        assert after["type"] == "run.scope", after
        assert (after["scope"], after["document_version"]) == ([{"from": 29, "to": 39}], 3)
        # inside it: the run ends
        await bob.send({"type": "editor.change", "document_version": 4,
                        "changes": [{"from": 35, "to": 36, "insert": 0}]})
        finished = await bob.recv_until("run.finished")
        assert (finished["status"], finished["reason"]) == ("aborted", "document_changed")
