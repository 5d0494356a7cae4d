"""Several cowrite instances (subprocesses) sharing one real redis-server."""

import asyncio
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from bench.common import Proc
from tests.cluster_support import FAST_LEASE, cluster, join, seqs, start_run
from tests.harness import token, ws_client
from tests.runs import call, of_run, script

pytestmark = [pytest.mark.redis, pytest.mark.slow]


async def test_fan_out_across_instances_with_identical_seq() -> None:
    async with cluster() as (_, (one, two)), join(one, client_id="a") as (a, wa), \
            join(two, sub="bob", client_id="b") as (b, wb):
        assert wa["epoch"] == wb["epoch"]
        await asyncio.gather(*(a.send({"type": "editor.change", "document_version": i})
                               for i in range(20)),
                             *(b.send({"type": "editor.change", "document_version": i})
                               for i in range(20)))
        seen_a, seen_b = await seqs(a, 40), await seqs(b, 40)
        assert seen_a == seen_b == list(range(1, 41))


async def test_resume_on_another_instance() -> None:
    async with cluster() as (_, (one, two)), join(two, sub="bob", client_id="w") as (writer, _):
        async with join(one) as (reader, welcome):
            await writer.send({"type": "editor.change"})
            assert await seqs(reader, 1) == [1]
        for _ in range(5):
            await writer.send({"type": "editor.change"})
        await seqs(writer, 6)
        resume = {"epoch": welcome["epoch"], "after_seq": 1}
        async with join(two, resume=resume) as (again, back):
            assert back["resumed"] is True and back["replayed"] == 5
            assert await seqs(again, 6) == [2, 3, 4, 5, 6]


async def test_connection_limit_is_shared() -> None:
    env = {"COWRITE_MAX_CONNECTIONS_PER_USER": "2"}
    async with cluster(env=env) as (_, (one, two)), join(one, client_id="x"), \
            join(two, client_id="y"):
        async with ws_client(one.url("/v1/documents/doc-1/ws")) as third:
            await third.send({"type": "hello", "protocol": 1, "client_id": "z",
                              "token": token()})
            assert await third.expect_close() == 4008


async def test_redis_outage_readyz_clear_errors_and_recovery() -> None:
    async with cluster() as (redis, (one, two)), join(one, client_id="a") as (a, _), \
            join(two, sub="bob", client_id="b") as (b, _):
        await a.send({"type": "editor.change"})
        assert await seqs(b, 1) == [1]
        await redis.stop()
        async with httpx.AsyncClient() as http:
            for _ in range(50):
                if (await http.get(one.url("/readyz", "http"))).status_code == 503:
                    break
                await asyncio.sleep(0.1)
            assert (await http.get(one.url("/readyz", "http"))).status_code == 503
            assert (await http.get(one.url("/healthz", "http"))).status_code == 200
            await a.send({"type": "editor.change", "id": "during"})
            error = await a.recv_until("error", timeout=10)
            assert error["code"] == "unavailable" and error["reply_to"] == "during"
            assert error["retry_after_ms"] > 0
            await redis.start()
            for _ in range(100):
                if (await http.get(one.url("/readyz", "http"))).status_code == 200:
                    break
                await asyncio.sleep(0.1)
        await asyncio.sleep(1.5)  # let pub/sub reconnect
        await a.send({"type": "editor.change", "id": "after"})
        assert await seqs(b, 2) == [2]  # the connection survived; nothing before was lost
        assert (await a.recv_until(lambda e: e.get("seq") == 2))["type"] == "document.changed"


# -- runs owned by one instance, driven through another ------------------------------
async def test_tool_result_and_approval_answered_through_another_instance() -> None:
    steps = script({"tool_calls": [call("read_document")]},
                   {"tool_calls": [call("replace_document", text="new")]}, {"say": "done"})
    async with cluster() as (_, (one, two)), join(one, client_id="tab") as (owner_tab, _), \
            join(two, client_id="other-tab") as (elsewhere, _):
        await start_run(owner_tab, steps, "x-1")
        tool_call = await elsewhere.recv_until("tool.call")
        await elsewhere.send({"type": "tool.result", "id": "r", "run_id": "x-1",
                              "call_id": tool_call["call_id"], "token": tool_call["token"],
                              "output": {"text": "via two"}})
        ack = await elsewhere.recv_until(lambda e: e.get("reply_to") == "r")
        assert ack["type"] == "ack" and ack["status"] == "accepted"
        requested = await elsewhere.recv_until("approval.requested")
        await elsewhere.send({"type": "approval", "id": "a", "run_id": "x-1",
                              "call_id": requested["call_id"], "decision": "approve"})
        assert (await elsewhere.recv_until(lambda e: e.get("reply_to") == "a"))["type"] == "ack"
        replace = await owner_tab.recv_until(lambda e: e.get("type") == "tool.call"
                                             and e["name"] == "replace_document")
        await owner_tab.send({"type": "tool.result", "run_id": "x-1", "token": replace["token"],
                              "call_id": replace["call_id"], "output": {"ok": True}})
        finished = await elsewhere.recv_until("run.finished")
        assert finished["status"] == "completed"
        async with join(two, sub="bob", client_id="late") as (_, late):
            assert late.get("active_run") is None


async def test_editor_change_on_another_instance_aborts_the_run() -> None:
    long_text = script({"say": "word " * 500}, chunk_chars=4, delay_ms=10)
    async with cluster() as (_, (one, two)), join(one) as (owner_tab, _), \
            join(two, sub="bob", client_id="b") as (bob, _):
        await start_run(owner_tab, long_text, "x-2")
        await bob.recv_until("message.delta")
        async with join(two, sub="carol", client_id="c") as (_, seen):
            assert seen["active_run"]["run_id"] == "x-2"  # the snapshot crosses instances
        await bob.send({"type": "run.start", "id": "busy", "prompt": "mine"})
        assert (await bob.recv_until("error"))["code"] == "document_busy"
        await bob.send({"type": "editor.change"})
        finished = await bob.recv_until("run.finished")
        assert finished["status"] == "aborted" and finished["reason"] == "document_changed"
        await owner_tab.recv_until("run.finished")
        await asyncio.sleep(0.3)
        after = [e for e in of_run(owner_tab.events, "x-2")
                 if e["seq"] > finished["seq"]]
        assert after == []


async def test_the_same_result_sent_to_two_instances_completes_the_call_once() -> None:
    async with cluster() as (_, (one, two)), join(one, client_id="t1") as (first, _), \
            join(two, client_id="t2") as (second, _):
        # a second call keeps the run going while the duplicate travels
        await start_run(first, script({"tool_calls": [call("read_document")]},
                                      {"tool_calls": [call("read_document")]}), "x-3")
        tool_call = await first.recv_until("tool.call")
        result = {"type": "tool.result", "run_id": "x-3", "call_id": tool_call["call_id"],
                  "token": tool_call["token"], "output": {"text": "same"}}
        await asyncio.gather(first.send({**result, "id": "one"}),
                             second.send({**result, "id": "two"}))
        replies = [await first.recv_until(lambda e: e.get("reply_to") == "one"),
                   await second.recv_until(lambda e: e.get("reply_to") == "two")]
        assert sorted(bool(r.get("duplicate")) for r in replies) == [False, True]
        second_call = await first.recv_until(lambda e: e.get("type") == "tool.call"
                                             and e["call_id"] != tool_call["call_id"])
        await first.send({**result, "call_id": second_call["call_id"],
                          "token": second_call["token"]})
        await first.recv_until("run.finished")
        dones = of_run(first.events, "x-3", "tool.done")
        assert [d["call_id"] for d in dones] == [tool_call["call_id"], second_call["call_id"]]


async def test_a_killed_owners_run_is_taken_over_and_its_pending_call_carries_over() -> None:
    async with cluster(env=FAST_LEASE) as (_, (one, two)):
        finished = await asyncio.wait_for(_takeover_scenario(one, two), 30)
        assert finished["status"] == "completed"


async def _takeover_scenario(one: Proc, two: Proc) -> dict[str, Any]:
    async with join(two, sub="bob", client_id="watch") as (watcher, welcome):
        assert "durable_runs" in welcome["features"]
        async with join(one) as (doomed, mine):
            await start_run(doomed, script({"tool_calls": [call("read_document")]},
                                           {"say": "after"}), "x-4")
            tool_call = await doomed.recv_until("tool.call")  # the token is only for her
            one.process.kill()  # kill -9: no drain, no goodbye
            await doomed.expect_close()
        resumed = await watcher.recv_until("run.resumed", timeout=10)
        assert (resumed["run_id"], resumed["reason"], resumed["step"]) == ("x-4", "owner_lost", 1)
        # the executor's tab comes back on the survivor and answers with the dead owner's token
        resume = {"epoch": mine["epoch"], "after_seq": mine["last_seq"]}
        async with join(two, resume=resume) as (again, back):
            assert back["resumed"] is True and back["active_run"]["run_id"] == "x-4"
            assert back["active_run"]["pending"][0]["call_id"] == tool_call["call_id"]
            await again.send({"type": "tool.result", "id": "late", "run_id": "x-4",
                              "call_id": tool_call["call_id"], "token": tool_call["token"],
                              "output": {"text": "doc"}})
            accepted = await again.recv_until(lambda e: e.get("reply_to") == "late")
            assert accepted["type"] == "ack" and accepted["status"] == "accepted"
            finished = await again.recv_until("run.finished", timeout=10)
        calls = [e for e in watcher.events if e.get("type") == "tool.call"]
        assert [c["call_id"] for c in calls] == [tool_call["call_id"]]  # sent once
        await watcher.recv_until("run.finished", timeout=10)
        assert len([e for e in watcher.events if e.get("type") == "run.finished"]) == 1
        return finished


async def test_sigterm_hands_the_run_over_instead_of_ending_it() -> None:
    async with cluster(env=FAST_LEASE) as (_, (one, two)), \
            join(two, sub="bob", client_id="watch") as (watcher, _):
        async with join(one) as (leaving, mine):
            await start_run(leaving, script({"tool_calls": [call("read_document")]},
                                            {"say": "after"}), "x-6")
            tool_call = await leaving.recv_until("tool.call")
            one.process.terminate()  # SIGTERM: a rolling deploy
            assert await leaving.expect_close(timeout=10) == 1001
        resumed = await watcher.recv_until("run.resumed", timeout=10)
        assert (resumed["run_id"], resumed["reason"]) == ("x-6", "handoff")
        resume = {"epoch": mine["epoch"], "after_seq": mine["last_seq"]}
        async with join(two, resume=resume) as (again, _):
            await again.send({"type": "tool.result", "id": "r", "run_id": "x-6",
                              "call_id": tool_call["call_id"], "token": tool_call["token"],
                              "output": {"text": "doc"}})
            assert (await again.recv_until(lambda e: e.get("reply_to") == "r"))["type"] == "ack"
            finished = await again.recv_until("run.finished", timeout=10)
        assert finished["status"] == "completed"
        ends = [e for e in watcher.events if e.get("type") == "run.finished"]
        assert not [e for e in ends if e.get("reason") == "server_shutdown"]


async def test_a_model_call_cut_by_the_owners_death_is_made_again() -> None:
    text = "word " * 60
    async with cluster(env=FAST_LEASE) as (_, (one, two)), \
            join(two, sub="bob", client_id="watch") as (watcher, _):
        async with join(one) as (doomed, _):
            await start_run(doomed, script({"say": text}, chunk_chars=5, delay_ms=40), "x-5")
            for _ in range(3):
                await watcher.recv_until("message.delta")
            one.process.kill()
        resumed = await watcher.recv_until("run.resumed", timeout=10)
        discarded = await watcher.recv_until("message.discarded", timeout=10)
        assert discarded["message_id"] == "x-5:m1" and discarded["seq"] > resumed["seq"]
        done = await watcher.recv_until("message.done", timeout=15)
        assert done["text"] == text and done["message_id"] != "x-5:m1"
        assert (await watcher.recv_until("run.finished", timeout=10))["status"] == "completed"


async def test_same_client_supersedes_its_run_from_another_instance() -> None:
    long_text = script({"say": "z" * 400}, chunk_chars=1, delay_ms=20)
    async with cluster() as (_, (one, two)):
        async with join(one, client_id="tab") as (tab, _):
            await start_run(tab, long_text, "x-5")
            await tab.recv_until("message.delta")
        async with join(two, client_id="tab") as (same_tab, _):  # reconnected elsewhere
            await start_run(same_tab, script({"say": "newer"}), "x-6")
            old = await same_tab.recv_until(lambda e: e.get("type") == "run.finished"
                                            and e["run_id"] == "x-5")
            assert old["status"] == "cancelled" and old["reason"] == "superseded"
            new = await same_tab.recv_until(lambda e: e.get("type") == "run.finished"
                                            and e["run_id"] == "x-6")
            assert new["status"] == "completed"


async def test_a_tab_told_the_run_ended_is_not_contradicted_by_a_late_welcome() -> None:
    """The owner frees the run's record only after logging `run.finished`; a tab joining
    another instance in between must not be shown, as active, a run that instance has
    already told its other tabs is over. The in-between is recreated by putting the
    running record back once the run has ended (the race it stands for is rare)."""
    key = "cw:{doc-1}:active"
    async with cluster() as (redis, (one, two)), join(one, client_id="tab") as (owner, _), \
            join(two, sub="bob", client_id="b") as (elsewhere, _):
        await start_run(owner, script({"tool_calls": [call("read_document")]},
                                      {"say": "done"}), "x-9")
        tool_call = await owner.recv_until("tool.call")
        client = aioredis.Redis(port=redis.port)
        try:
            running = await client.get(key)
            assert running is not None
            await owner.send({"type": "tool.result", "run_id": "x-9", "token": tool_call["token"],
                              "call_id": tool_call["call_id"], "output": {"text": "t"}})
            assert (await elsewhere.recv_until("run.finished"))["run_id"] == "x-9"
            for _ in range(100):  # the owner's release, then the record as it was before
                if await client.get(key) is None:
                    break
                await asyncio.sleep(0.02)
            await client.set(key, running)
            async with join(two, sub="carol", client_id="c") as (_, late):
                assert late.get("active_run") is None
            async with join(one, sub="dave", client_id="d") as (_, owners):
                assert owners.get("active_run") is None  # the owner knows from its driver
        finally:
            await client.aclose()
