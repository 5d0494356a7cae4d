"""Durable runs (PROTOCOL.md section 13, issue 12) with real redis-server and real
server processes: the owner killed while an approval waits, a server tool cut
mid-call, every instance gone at once (the startup sweep)."""

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import pytest

from bench.common import server_process
from tests.cluster_support import (
    FAST_LEASE,
    cluster,
    ended,
    instance,
    join,
    killed,
    last_seq,
    start_run,
)
from tests.fake_openai import Reply, running_fake_openai
from tests.harness import SECRET, Client, joined, running_server
from tests.kill_proxy import DropReplyProxy, KillProxy
from tests.redis_support import redis_process
from tests.runs import answer, call, of_run, script, start
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


async def test_a_taken_over_call_whose_client_died_with_the_owner_ends_after_the_grace(
        ) -> None:
    """Her tab was on the owner that died: the new owner used to wait for the call's
    whole deadline (tool timeout, status timed_out) instead of the client grace."""
    env = {**FAST_LEASE, "COWRITE_CLIENT_GRACE_S": "2", "COWRITE_TOOL_TIMEOUT_S": "120"}
    async with cluster(2, env=env) as (_, (one, two)), \
            join(two, sub="bob", client_id="watch") as (watcher, _):
        async with join(one) as (doomed, _):
            await start_run(doomed, script({"tool_calls": [call("read_document")]}), "g-1")
            await doomed.recv_until("tool.call")
            await killed(one)
        await watcher.recv_until("run.resumed", timeout=TAKEOVER_S)
        finished = await watcher.recv_until(ended("g-1"), timeout=TAKEOVER_S + 10)
        assert (finished["status"], finished["reason"]) == ("aborted", "client_gone")


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


async def test_a_fresh_instance_takes_over_the_runs_of_a_dead_cluster() -> None:
    text = "word " * 40
    async with cluster(env=FAST_LEASE) as (redis, (one, two)):
        async with join(one, "doc-a") as (tab_a, welcome_a), \
                join(two, "doc-b", sub="bob") as (tab_b, welcome_b):
            await start_run(tab_a, script({"tool_calls": [call("read_document")]},
                                          {"say": "after"}), "s-a")
            tool_call = await tab_a.recv_until("tool.call")
            await start_run(tab_b, script({"say": text}, chunk_chars=5, delay_ms=40), "s-b")
            await tab_b.recv_until("message.delta")
            await asyncio.gather(killed(one), killed(two))  # no instance is left
        seen_a, seen_b = last_seq(tab_a, welcome_a), last_seq(tab_b, welcome_b)
        async with instance(redis, FAST_LEASE) as fresh, \
                join(fresh, "doc-a", resume={"epoch": welcome_a["epoch"],
                                             "after_seq": seen_a}) as (again_a, _), \
                join(fresh, "doc-b", sub="bob", resume={"epoch": welcome_b["epoch"],
                                                        "after_seq": seen_b}) as (again_b, _):
            for again, run_id in ((again_a, "s-a"), (again_b, "s-b")):
                resumed = await again.recv_until("run.resumed", timeout=TAKEOVER_S)
                assert (resumed["run_id"], resumed["reason"]) == (run_id, "owner_lost")
            await answer(again_a, tool_call, {"text": "doc"})  # the dead owner's token
            finished_a = await again_a.recv_until(ended("s-a"), timeout=TAKEOVER_S)
            discarded = await again_b.recv_until("message.discarded", timeout=TAKEOVER_S)
            done = await again_b.recv_until("message.done", timeout=TAKEOVER_S)
            finished_b = await again_b.recv_until(ended("s-b"), timeout=TAKEOVER_S)
        assert finished_a["status"] == finished_b["status"] == "completed"
        assert discarded["message_id"] == "s-b:m1"
        assert done["text"] == text and done["message_id"] != "s-b:m1"
        assert [e["call_id"] for e in of_run(tab_a.events + again_a.events, "s-a",
                                             "tool.call")] == [tool_call["call_id"]]
        contiguous(again_a, seen_a)
        contiguous(again_b, seen_b)


async def test_a_fresh_instance_ends_the_runs_older_than_the_run_timeout() -> None:
    env = {**FAST_LEASE, "COWRITE_RUN_TIMEOUT_S": "3"}
    async with redis_process() as redis:
        async with instance(redis, env) as doomed, join(doomed) as (tab, welcome):
            await start_run(tab, script({"tool_calls": [call("read_document")]}), "o-1")
            started = await tab.recv_until("run.started")
            tool_call = await tab.recv_until("tool.call")
            await killed(doomed)  # before its own run timeout could end the run
        seen = last_seq(tab, welcome)
        await asyncio.sleep(max(0.0, started["ts"] / 1000 + 3.5 - time.time()))
        async with instance(redis, env) as fresh, \
                join(fresh, resume={"epoch": welcome["epoch"], "after_seq": seen}) as (again, _):
            finished = await again.recv_until(ended("o-1"), timeout=TAKEOVER_S)
            assert (finished["status"], finished["reason"]) == ("aborted", "server_lost")
            cancelled = of_run(again.events, "o-1", "tool.done")
            assert [(d["call_id"], d["status"]) for d in cancelled] == [
                (tool_call["call_id"], "cancelled")]
            await answer(again, tool_call, {"text": "too late"}, id="late")
            late = await again.recv_until(lambda e: e.get("reply_to") == "late")
            assert late["code"] == "run_not_active"
            assert not of_run(again.events, "o-1", "run.resumed")
            assert len(of_run(again.events, "o-1", "run.finished")) == 1
            contiguous(again, seen)


async def test_a_lone_instance_still_ends_its_runs_on_sigterm() -> None:
    """Section 6 when nobody could take the run: SIGTERM ends it `server_shutdown`, and
    an instance started later finds nothing left to take over."""
    async with redis_process() as redis:
        async with instance(redis, FAST_LEASE) as alone, join(alone) as (tab, welcome):
            await start_run(tab, script({"tool_calls": [call("read_document")]}), "l-1")
            await tab.recv_until("tool.call")
            alone.process.terminate()
            finished = await tab.recv_until(ended("l-1"), timeout=10)
            assert (finished["status"], finished["reason"]) == ("aborted", "server_shutdown")
            assert await tab.expect_close(timeout=10) == 1001
        seen = last_seq(tab, welcome)
        async with instance(redis, FAST_LEASE) as later, \
                join(later, resume={"epoch": welcome["epoch"], "after_seq": seen}) as (again, back):
            assert back["resumed"] is True and back.get("active_run") is None
            await asyncio.sleep(1.5)  # a lease and more: nothing is taken over or ended again
            await again.send({"type": "ping", "ts": 1})
            await again.recv_until("pong")
            assert [e for e in again.events if "seq" in e] == []


@pytest.mark.parametrize("kind", ["tool.result", "approval"])
async def test_an_answer_leaves_the_owners_inbox_only_once_applied(
        kind: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A result forwarded to the run's owner was taken from its inbox before it was
    applied: an owner killed in between lost it (the next owner's replay reads only
    what is left) and the call timed out. Here the owner fails while applying it; an
    answer for a run this instance does not drive is taken first, as before (a
    stalled owner must not apply what its successor replayed)."""
    name = "read_document" if kind == "tool.result" else "replace_document"
    async with redis_process() as redis, running_server(redis_url=redis.url) as server, \
            joined(server) as (alice, _):
        router, backend = server.services.router, server.services.backend
        arguments = {} if kind == "tool.result" else {"text": "x"}
        await start(alice, script({"tool_calls": [call(name, **arguments)]}, {"say": "ok"}),
                    run_id="r-1")
        asked = await alice.recv_until("tool.call" if kind == "tool.result"
                                       else "approval.requested")
        response = {"type": kind, "id": "ans", "run_id": "r-1", "call_id": asked["call_id"],
                  **({"token": asked["token"], "output": 1} if kind == "tool.result" else
                     {"decision": "approve"})}
        envelope = {"kind": "message", "document_id": "doc-1", "origin": "elsewhere",
                    "connection": "c", "user_id": "alice", "client_id": "tab",
                    "message": response}
        applying = asyncio.Event()

        async def dies_while_applying(message: dict[str, Any]) -> None:
            applying.set()
            raise RuntimeError("killed while applying")

        monkeypatch.setattr(router, "_dispatch", dies_while_applying)
        with caplog.at_level(logging.CRITICAL, logger="cowrite.remote"):
            await backend.send(router.me, envelope)
            await asyncio.wait_for(applying.wait(), 10)
            await asyncio.sleep(0.2)
        assert [message for _, message in await backend.unread_messages(router.me)] == \
            [envelope]  # left for whoever takes the run over
        monkeypatch.undo()
        other = {**envelope, "message": {**response, "run_id": "r-other"}}
        await backend.send(router.me, other)  # not this instance's run: taken first
        await backend.send(router.me, {**envelope, "message": {**response, "id": "again"}})
        for _ in range(100):  # applied this time (the run goes on), then taken
            if not [m for _, m in await backend.unread_messages(router.me) if m != envelope]:
                break
            await asyncio.sleep(0.05)
        assert [message for _, message in await backend.unread_messages(router.me)] == \
            [envelope]
        if kind == "approval":  # approved: the editor runs the call
            tool_call = await alice.recv_until("tool.call", timeout=10)
            await answer(alice, tool_call, {"ok": True})
        assert (await alice.recv_until("run.finished", timeout=10))["status"] == "completed"


@pytest.mark.parametrize("written", [False, True])
async def test_an_owner_killed_as_it_announces_a_call_leaves_a_run_that_goes_on(
        written: bool) -> None:
    """The owner killed as it writes the decision that announces a `tool.call`: its
    checkpoint used to be written in one step and the events in another, so a crash
    in between left a survivor a run waiting on a call nobody was told of (it timed
    out). Now both or neither are written: the survivor asks for the call (again, when
    neither was: the model's turn is made again), and the run completes."""
    env = {**FAST_LEASE, "COWRITE_TOOL_TIMEOUT_S": "30"}
    steps = script({"say": "let me look", "tool_calls": [call("read_document")]},
                   {"say": "thanks"}, delay_ms=200)
    async with redis_process() as redis, \
            KillProxy(redis.port, b'"type":"tool.call"', after=written) as proxy, \
            instance(redis, env) as survivor, \
            server_process("cowrite", COWRITE_REDIS_URL=proxy.url, COWRITE_JWT_SECRET=SECRET,
                           **env) as owner:
        async with join(owner) as (first, mine):
            await start_run(first, steps, "k-1")
            seen = last_seq(first, mine)
        # Her tab moved to the survivor (a reconnect through the load balancer) before
        # the owner dies: she stays connected throughout.
        resume = {"epoch": mine["epoch"], "after_seq": seen}
        async with join(survivor, resume=resume) as (alice, _):
            proxy.pid = owner.process.pid
            await asyncio.wait_for(proxy.fired.wait(), TAKEOVER_S)
            await owner.process.wait()
            tool_call = await alice.recv_until("tool.call", timeout=TAKEOVER_S)
            await answer(alice, tool_call, {"text": "the document"})
            finished = await alice.recv_until(ended("k-1"), timeout=TAKEOVER_S)
            assert finished["status"] == "completed", finished
            assert len(of_run(alice.events, "k-1", "tool.call")) == 1
            assert of_run(alice.events, "k-1", "run.resumed")
            contiguous(alice, seen)


async def test_a_result_whose_write_lost_its_reply_is_applied_once_and_acked() -> None:
    """The write that applies a client's `tool.result` ran, but its reply from Redis
    was lost: the client was told `unavailable` to retry, and its retry logged a
    second `tool.done`. The write is now idempotent and retried to learn its outcome."""
    steps = script({"say": "let me look", "tool_calls": [call("read_document")]},
                   {"say": "thanks"})
    async with redis_process() as redis, \
            DropReplyProxy(redis.port, b'"type":"tool.done"') as proxy, \
            server_process("cowrite", COWRITE_REDIS_URL=proxy.url,
                           COWRITE_JWT_SECRET=SECRET) as owner, join(owner) as (alice, _):
        await start_run(alice, steps, "l-1")
        tool_call = await alice.recv_until("tool.call", timeout=TAKEOVER_S)
        proxy.armed = True
        await answer(alice, tool_call, {"text": "doc"}, id="res")
        reply = await alice.recv_until(lambda e: e.get("reply_to") == "res", timeout=TAKEOVER_S)
        assert proxy.fired.is_set()
        assert reply["type"] == "ack" and reply["status"] == "accepted", reply
        finished = await alice.recv_until(ended("l-1"), timeout=TAKEOVER_S)
        assert finished["status"] == "completed"
        assert len(of_run(alice.events, "l-1", "tool.done")) == 1
