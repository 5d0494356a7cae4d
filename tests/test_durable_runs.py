"""Durable runs (PROTOCOL.md section 13, issue 12) with real redis-server and real
server processes: the owner killed while an approval waits, a server tool cut
mid-call, every instance gone at once (the startup sweep)."""

from pathlib import Path

import pytest

from tests.cluster_support import (
    FAST_LEASE,
    cluster,
    ended,
    join,
    killed,
    last_seq,
    start_run,
)
from tests.fake_openai import Reply, running_fake_openai
from tests.harness import Client
from tests.runs import answer, call, of_run, script
from tests.tool_support import file_says

pytestmark = pytest.mark.redis
TAKEOVER_S = 15  # the lease (1 s) + a janitor tick, on a loaded 2-core machine
SERVER_TOOLS = """
[[tools]]
import = "tests.tool_fixtures:wait_once"
timeout_s = 120
[[tools]]
import = "tests.tool_fixtures:wait_again"
timeout_s = 120
idempotent = true
"""


def contiguous(client: Client, after: int) -> list[int]:
    """The seqs this connection received, checked: after `after`, none lost or twice."""
    got = [e["seq"] for e in client.events if "seq" in e]
    assert got == list(range(after + 1, after + 1 + len(got))), got
    return got


async def test_owner_killed_while_an_approval_waits() -> None:
    steps = script({"tool_calls": [call("replace_document", text="new")]}, {"say": "done"})
    async with cluster(3, env=FAST_LEASE) as (_, (one, two, three)), \
            join(two, sub="bob", client_id="watch") as (watcher, _):
        async with join(one) as (doomed, mine):
            await start_run(doomed, steps, "d-1")
            requested = await doomed.recv_until("approval.requested")
            seen = last_seq(doomed, mine)
            await killed(one)
        # Her tab comes back at once, on another instance, before any takeover, and
        # answers the approval it already saw: the answer waits for the new owner.
        resume = {"epoch": mine["epoch"], "after_seq": seen}
        async with join(three, resume=resume) as (again, back):
            assert back["resumed"] is True
            pending = back["active_run"]["pending"]
            assert [(p["kind"], p["call_id"]) for p in pending] == [
                ("approval", requested["call_id"])]
            await again.send({"type": "approval", "id": "yes", "run_id": "d-1",
                              "call_id": requested["call_id"], "decision": "approve"})
            ack = await again.recv_until(lambda e: e.get("reply_to") == "yes",
                                         timeout=TAKEOVER_S)
            assert ack["type"] == "ack", ack
            tool_call = await again.recv_until("tool.call", timeout=TAKEOVER_S)
            assert tool_call["call_id"] == requested["call_id"]
            await answer(again, tool_call, {"ok": True})
            finished = await again.recv_until(ended("d-1"), timeout=TAKEOVER_S)
            assert finished["status"] == "completed"
            contiguous(again, seen)
            assert not of_run(again.events, "d-1", "approval.requested")  # not sent twice
        resumed = await watcher.recv_until("run.resumed", timeout=TAKEOVER_S)
        assert (resumed["run_id"], resumed["reason"]) == ("d-1", "owner_lost")
        await watcher.recv_until(ended("d-1"), timeout=TAKEOVER_S)
        assert [e["call_id"] for e in of_run(watcher.events, "d-1", "approval.requested")] \
            == [requested["call_id"]]
        assert [e["call_id"] for e in of_run(watcher.events, "d-1", "tool.call")] == \
            [requested["call_id"]]
        assert [e["decision"] for e in of_run(watcher.events, "d-1", "approval.resolved")] \
            == ["approve"]
        assert len(of_run(watcher.events, "d-1", "run.finished")) == 1
        contiguous(watcher, 0)


@pytest.mark.parametrize("idempotent", [True, False])
async def test_a_server_tool_cut_mid_call(tmp_path: Path, idempotent: bool) -> None:
    config, marker = tmp_path / "cowrite.toml", tmp_path / "marker"
    config.write_text(SERVER_TOOLS)
    tool = "wait_again" if idempotent else "wait_once"
    async with running_fake_openai() as fake:
        fake.replies = [Reply(tool_calls=[{"name": tool, "arguments": {"marker": str(marker)}}]),
                        Reply(text=["noted"])]
        env = {**FAST_LEASE, "COWRITE_LLM": "openai", "COWRITE_OPENAI_API_KEY": "sk-test",
               "COWRITE_OPENAI_BASE_URL": fake.base_url, "COWRITE_OPENAI_WARMUP_TIMEOUT_S": "0",
               "COWRITE_CONFIG": str(config)}
        async with cluster(env=env) as (_, (one, two)), \
                join(two, sub="bob", client_id="watch") as (watcher, _):
            async with join(one) as (starter, _):
                await start_run(starter, "use the tool", "t-1", tools=[])
                called = await watcher.recv_until("tool.call")
                assert (called["name"], called["executor"]) == (tool, "server")
                await file_says(marker, "start")  # the tool is running on `one`
                await killed(one)
            resumed = await watcher.recv_until("run.resumed", timeout=TAKEOVER_S)
            assert (resumed["run_id"], resumed["reason"]) == ("t-1", "owner_lost")
            done = await watcher.recv_until("tool.done", timeout=TAKEOVER_S)
            finished = await watcher.recv_until(ended("t-1"), timeout=TAKEOVER_S)
        assert finished["status"] == "completed"
        assert done["call_id"] == called["call_id"]
        assert len(of_run(watcher.events, "t-1", "tool.call")) == 1  # never announced twice
        assert len(of_run(watcher.events, "t-1", "run.finished")) == 1
        told = fake.requests[1]["messages"][-1]  # what the model read as the tool's answer
        assert told["role"] == "tool"
        if idempotent:  # run again on the new owner; its result reached the model
            assert (done["status"], done["output"]) == ("ok", "done after 2 starts")
            assert "done after 2 starts" in told["content"]
            assert marker.read_text().split() == ["start", "start", "end"]
        else:  # not run again: the model is told it was interrupted
            assert done["status"] == "error" and "interrupted" in done["error"]["message"]
            assert "interrupted" in told["content"]
            assert marker.read_text().split() == ["start"]
