"""A person's edits while the run's owner drains (PROTOCOL.md sections 11-13): three
cowrite instances (subprocesses) on one real redis-server.

Bob types on one instance while the instance that runs Alice's run gets SIGTERM and
hands the run over. Each edit's change list is in the coordinates the edits before
it left, so the run must see every one of them once, in the order he made them,
across the handover: sent before it (to the old owner), while nobody holds the run,
and to the new owner while it is still adopting the run. Swapped, an edit far from
the run's scope can land inside it and abort the run; lost or applied twice, the
scope ends off by a few units.
"""

import asyncio
from typing import Any

import pytest

from tests.cluster_support import (
    cluster,
    edits_around_scope,
    ended,
    join,
    last_seq,
    scope_after,
)
from tests.runs import EDITOR_TOOLS, answer, call, script

pytestmark = [pytest.mark.redis, pytest.mark.slow]

# A handoff does not wait for the lease (it gives it up at once); 2 s, as in the
# rolling-restart test, keeps a starved core from lapsing leases while instances start.
LEASE = {"COWRITE_RUN_LEASE_S": "2"}
TEXT = {"text": "0123456789" * 4, "version": 1}
SCOPE_START = 200
EDITS = 100
BURST, PAUSE_S = 5, 0.05  # typed in bursts: about a second of typing
TERM_AFTER = 12  # edits sent before the owner gets SIGTERM (in the middle of a burst)
TAKEOVER_S = 15


def _edits() -> list[tuple[int, int, int]]:
    return edits_around_scope(EDITS, SCOPE_START)


def _scope_after_edits() -> list[dict[str, int]]:
    return scope_after(_edits(), (SCOPE_START, SCOPE_START + 10))


def _last_scope_or_end(event: dict[str, Any]) -> bool:
    """The run's scope after the last edit, or its end (an edit touched its scope)."""
    return event.get("type") == "run.finished" or (
        event.get("type") == "run.scope" and event.get("document_version") == EDITS + 1)


def _of(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e.get("type") == kind and e.get("run_id") == "handed"]


async def test_edits_typed_through_a_handover_reach_the_run_once_and_in_order() -> None:
    steps = script({"tool_calls": [call("read_document")]},
                   {"tool_calls": [call("read_document")]}, {"say": "done"})
    async with cluster(3, env=LEASE) as (_, (owner, spare, typist)), \
            join(typist, sub="bob", client_id="b") as (bob, _):
        async with join(owner, client_id="a") as (alice, welcome):
            await alice.send({"type": "run.start", "id": "s", "run_id": "handed",
                              "prompt": steps, "tools": EDITOR_TOOLS,
                              "context": {"document": TEXT,
                                          "scope": [{"from": SCOPE_START,
                                                     "to": SCOPE_START + 10}]},
                              "options": {"on_edit": "overlap"}})
            first = await alice.recv_until(lambda e: e.get("type") == "tool.call")
            await bob.recv_until(lambda e: e.get("type") == "tool.call")
            for version, (start, to, insert) in enumerate(_edits(), start=2):
                if version - 2 == TERM_AFTER:
                    owner.process.terminate()  # drains: hands the run over
                await bob.send({"type": "editor.change", "document_version": version,
                                "changes": [{"from": start, "to": to, "insert": insert}]})
                if (version - 1) % BURST == 0:
                    await asyncio.sleep(PAUSE_S)
            assert await alice.expect_close(timeout=TAKEOVER_S) == 1001
            seen = last_seq(alice, welcome)
        await asyncio.wait_for(owner.process.wait(), TAKEOVER_S)
        # Her tab resumes on a live instance and answers the call it was asked.
        async with join(spare, client_id="a",
                        resume={"epoch": welcome["epoch"], "after_seq": seen}) as (again, _):
            last = await bob.recv_until(_last_scope_or_end, timeout=TAKEOVER_S)
            assert last["type"] == "run.scope", (last, _of(bob.events, "run.scope")[-3:])
            await answer(again, first, {"text": "doc"})
            second = await again.recv_until(lambda e: e.get("type") == "tool.call"
                                            and e["call_id"] != first["call_id"],
                                            timeout=TAKEOVER_S)
            await answer(again, second, {"text": "doc"})
            finished = await again.recv_until(ended("handed"), timeout=TAKEOVER_S)
        await bob.recv_until(ended("handed"), timeout=TAKEOVER_S)
    # taken over once (`owner_lost` if a starved owner's lease lapsed before its handoff)
    resumed = _of(bob.events, "run.resumed")
    assert len(resumed) == 1 and resumed[0]["reason"] in ("handoff", "owner_lost"), resumed
    assert finished["status"] == "completed", finished
    scopes = _of(bob.events, "run.scope")
    # every edit counted once, in the order it was made, and the run's next step was
    # at the document version of the last one
    assert [e["document_version"] for e in scopes] == list(range(2, EDITS + 2)), \
        " ".join(f"{e['document_version']}:{e['scope'][0]['from']}" for e in scopes)
    assert scopes[-1]["scope"] == _scope_after_edits()
    assert second["document_version"] == EDITS + 1
