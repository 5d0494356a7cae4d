"""A durable run's end (PROTOCOL.md section 13: exactly one `run.finished` per run)
when its owner dies or Redis goes away at that moment, with real redis-server and
real server processes.

An owner killed after logging `run.finished` but before freeing the run used to
leave a survivor a run to take "over": it came back to life (`run.resumed`, the
answer again, a second `run.finished`; a cancelled run waited on its call again,
the document busy). A `run.cancel` during a Redis outage longer than half a lease
got no answer, and the instance's own janitor then took its own run over from a
checkpoint that lacked the end: the cancel was lost."""

import asyncio
import signal
from typing import Any

import pytest

from bench.common import server_process
from server.agent.takeover import let_go_if_ended
from server.backends.redis import RedisBackend
from tests.cluster_support import ended, instance, join, last_seq, start_run
from tests.harness import SECRET, Client
from tests.kill_proxy import DropReplyProxy, KillProxy
from tests.redis_support import redis_process
from tests.runs import call, of_run, script

pytestmark = pytest.mark.redis
TAKEOVER_S = 15  # the lease (1-2 s) + a janitor tick, on a loaded 2-core machine
FINISHED = b'"type":"run.finished"'


def reply_to(message_id: str) -> Any:
    return lambda e: e.get("reply_to") == message_id


async def start_when_free(client: Client, timeout: float = TAKEOVER_S) -> dict[str, Any]:
    """Bob's `run.start`, sent again while the ended run still holds the document (told
    `unavailable`, to retry); the ack once it is freed."""
    loop = asyncio.get_running_loop()
    deadline, attempt = loop.time() + timeout, 0
    while True:
        attempt += 1
        await client.send({"type": "run.start", "id": f"b{attempt}", "run_id": f"b-{attempt}",
                           "prompt": script({"say": "mine"}), "tools": []})
        reply = await client.recv_until(reply_to(f"b{attempt}"))
        if reply["type"] == "ack" or loop.time() > deadline:
            return reply
        # e-1 has ended (its owner died before freeing it): not another run active
        assert reply["code"] == "unavailable" and reply["retry_after_ms"] > 0, reply
        await asyncio.sleep(reply["retry_after_ms"] / 1000)


@pytest.mark.parametrize("ending", ["completed", "cancelled"])
async def test_an_owner_killed_after_logging_the_end_leaves_the_run_ended(ending: str) -> None:
    env = {"COWRITE_RUN_LEASE_S": "1", "COWRITE_TOOL_TIMEOUT_S": "60",
           "COWRITE_CLIENT_GRACE_S": "60"}
    steps = script({"say": "hello world"}, delay_ms=100) if ending == "completed" else \
        script({"tool_calls": [call("read_document")]}, {"say": "done"})
    async with redis_process() as redis, \
            KillProxy(redis.port, FINISHED, after=True) as proxy, \
            instance(redis, env) as survivor, \
            server_process("cowrite", COWRITE_REDIS_URL=proxy.url, COWRITE_JWT_SECRET=SECRET,
                           **env) as owner, \
            join(survivor, sub="bob", client_id="watch") as (bob, _):
        async with join(owner) as (alice, mine):
            await start_run(alice, steps, "e-1")
            if ending == "cancelled":
                await alice.recv_until("tool.call")
            proxy.pid = owner.process.pid  # killed once its end reached Redis
            if ending == "cancelled":
                await alice.send({"type": "run.cancel", "id": "c", "run_id": "e-1"})
            await asyncio.wait_for(proxy.fired.wait(), TAKEOVER_S)
            await owner.process.wait()
        finished = await bob.recv_until(ended("e-1"), timeout=TAKEOVER_S)
        assert finished["status"] == ending, finished
        # The survivor takes the lapsed lease, finds the run ended, and frees it.
        ack = await start_when_free(bob)
        assert ack["type"] == "ack" and ack["run_id"].startswith("b-"), ack
        await bob.recv_until(ended(ack["run_id"]), timeout=TAKEOVER_S)
        # Her tab comes back (on the survivor) and is not shown the run as active.
        resume = {"epoch": mine["epoch"], "after_seq": last_seq(alice, mine)}
        async with join(survivor, resume=resume) as (_, back):
            assert back.get("active_run") is None, back
    assert not of_run(bob.events, "e-1", "run.resumed")
    assert len(of_run(bob.events, "e-1", "run.finished")) == 1
    assert not of_run(bob.events, "e-1", "message.discarded")


async def test_a_cancel_during_a_redis_outage_ends_the_run_once() -> None:
    """Redis frozen longer than half a lease as the user cancels: she is told
    `unavailable` (to retry) instead of nothing, and the end is logged once Redis is
    back, under the owner's lease: one `run.finished` `cancelled`, no takeover, the
    document free."""
    env = {"COWRITE_RUN_LEASE_S": "2", "COWRITE_TOOL_TIMEOUT_S": "60",
           "COWRITE_CLIENT_GRACE_S": "60"}
    steps = script({"tool_calls": [call("read_document")]}, {"say": "carrying on"})
    async with redis_process() as redis, instance(redis, env) as owner, \
            join(owner) as (alice, _):
        await start_run(alice, steps, "o-1")
        await alice.recv_until("tool.call")
        assert redis.process is not None
        redis.process.send_signal(signal.SIGSTOP)
        try:
            await alice.send({"type": "run.cancel", "id": "c", "run_id": "o-1"})
            reply = await alice.recv_until(reply_to("c"), timeout=10)
            await asyncio.sleep(2)  # longer than a lease in all
        finally:
            redis.process.send_signal(signal.SIGCONT)
        assert (reply["type"], reply.get("code")) == ("error", "unavailable"), reply
        assert reply["retry_after_ms"] > 0
        finished = await alice.recv_until(ended("o-1"), timeout=TAKEOVER_S)
        assert (finished["status"], finished["reason"]) == ("cancelled", "user_cancelled")
        # Her retry (after `retry_after_ms` while the owner has yet to learn that its end
        # is logged) learns that the run is over.
        for attempt in range(20):
            await alice.send({"type": "run.cancel", "id": f"again{attempt}", "run_id": "o-1"})
            again = await alice.recv_until(reply_to(f"again{attempt}"), timeout=10)
            if again.get("code") != "unavailable":
                break
            await asyncio.sleep(again["retry_after_ms"] / 1000)
        assert again.get("code") == "run_not_active", again
        async with join(owner, sub="bob", client_id="other") as (bob, welcome):
            assert welcome.get("active_run") is None, welcome
            ack = await start_when_free(bob, timeout=1)
            assert ack["type"] == "ack", ack
        await asyncio.sleep(3)  # more than a lease: nothing takes the run over
        await alice.send({"type": "ping", "ts": 1})
        await alice.recv_until("pong")
    assert not of_run(alice.events, "o-1", "run.resumed")
    assert len(of_run(alice.events, "o-1", "run.finished")) == 1
    assert [d["status"] for d in of_run(alice.events, "o-1", "tool.done")] == ["cancelled"]


async def test_an_end_whose_reply_was_lost_is_logged_once() -> None:
    """The write that logs the run's end ran, but its reply never came back (the
    connection to Redis cut after Redis acted): it is tried again, and the retry logs
    nothing twice (the end goes with its checkpoint, under one write id)."""
    async with redis_process() as redis, DropReplyProxy(redis.port, FINISHED) as proxy, \
            server_process("cowrite", COWRITE_REDIS_URL=proxy.url,
                           COWRITE_JWT_SECRET=SECRET) as owner, join(owner) as (alice, _):
        proxy.armed = True
        await start_run(alice, script({"say": "hello"}), "w-1")
        finished = await alice.recv_until(ended("w-1"), timeout=TAKEOVER_S)
        assert finished["status"] == "completed"
        assert proxy.fired.is_set()
        await alice.send({"type": "ping", "ts": 1})
        await alice.recv_until("pong")
        await asyncio.sleep(0.5)
    assert len(of_run(alice.events, "w-1", "run.finished")) == 1


async def test_a_run_whose_end_is_only_in_the_log_is_freed_not_taken_over() -> None:
    """An end logged without its checkpoint (a driver's last resort, a lost run ended
    by a janitor, an instance of the previous release): its `run.finished` among the
    log's last events is enough for the janitor to free the run, even after more events
    than the welcome looks at."""
    async with redis_process() as proc:
        backend = RedisBackend(proc.url)
        await backend.start()
        try:
            live = {"status": "waiting_tool", "user_id": "alice", "client_id": "tab"}
            for run_id in ("l-1", "l-2"):
                document = f"doc-{run_id}"
                record = {"run_id": run_id, **live, "owner": "janitor",
                          "checkpoint": {"status": "waiting_tool", "started_ms": 1}}
                assert await backend.claim_run(document, record, 1.0) is None
                await backend.put_run_record(document, run_id, live)
                if run_id == "l-1":
                    await backend.append(document, {
                        "type": "run.finished", "run_id": run_id, "status": "cancelled",
                        "reason": "user_cancelled", "steps": 1})
                for version in range(80):
                    await backend.append(document, {
                        "type": "document.changed", "document_version": version,
                        "user_id": "bob", "client_id": "other", "origin": "user"})
                freed = await let_go_if_ended(backend, "janitor", document, record)
                assert freed is (run_id == "l-1")
                active = await backend.active_run(document)
                final = await backend.get_run_record(document, run_id)
                assert final is not None
                if freed:
                    assert active is None and final["status"] == "cancelled"
                else:
                    assert active is not None and final["status"] == "waiting_tool"
        finally:
            await backend.close()
