"""A `run.start` while the document is still held by a run that has already ended.

A run's owner frees the document right after logging its `run.finished`; when Redis
is away at that moment (the chaos soak pauses it 2-3 s under a 2 s lease) the owner
gives up after half a lease and the claim stays until its lease lapses and a janitor
frees it. A tab that started its next run as soon as it saw `run.finished` was told
`error` `document_busy` "run '...-r57' of another client is active" (`tests/chaos.py`,
seed 11): the run was the tab's own and had ended, and `document_busy` means "another
run is active", which clients do not retry, so the tab waited for ever.

Now a claim of an ended run that its owner has not freed is transient: held by this
instance, the instance frees it itself (as its janitor would once the lease lapsed)
and the run starts; held by another instance (which alone may free it: the release is
fenced), the start is refused `unavailable` with `retry_after_ms` and the retry starts
the run once the claim is gone. What the owner left is written into a real
redis-server as it writes it; its lease is long, so only the fix can free it."""

import asyncio
import time
from typing import Any

import pytest

from server.backends.redis import RedisBackend
from tests.harness import Client, joined, running_server
from tests.redis_support import redis_process
from tests.runs import script
from tests.test_outage_gaps import OutageProxy

pytestmark = [pytest.mark.redis]
LONG_LEASE_S = 60.0  # nobody's janitor frees the claim while the test runs


def ended_claim(run_id: str, owner: str, client_id: str = "tab") -> dict[str, Any]:
    """The active record a run's end leaves (its final checkpoint says `completed`)."""
    return {"run_id": run_id, "status": "completed", "mode": "agent", "user_id": "alice",
            "client_id": client_id, "step": 1, "pending": [], "owner": owner}


async def start(client: Client, message_id: str, run_id: str, if_busy: str = "reject"
                ) -> dict[str, Any]:
    await client.send({"type": "run.start", "id": message_id, "run_id": run_id,
                       "prompt": script({"say": "hi"}), "tools": [],
                       "options": {"if_busy": if_busy}})
    return await client.recv_until(lambda e: e.get("reply_to") == message_id, timeout=15)


@pytest.mark.parametrize(("sub", "client_id", "if_busy"), [
    ("alice", "tab", "reject"), ("bob", "other", "reject"), ("bob", "other", "enqueue")])
async def test_a_start_while_another_instance_has_not_freed_an_ended_run_is_retried(
        sub: str, client_id: str, if_busy: str) -> None:
    """The ended run's owner is another instance (alive, Redis was away as it tried to
    free the document): the start is refused `unavailable` with `retry_after_ms`, never
    `document_busy`, and the message does not call the tab's own run another client's.
    Sent again once the owner has freed the claim, the same start starts the run. With
    `if_busy: enqueue` alike: no run is active nor queued, so it is not queued."""
    async with redis_process() as redis, running_server(redis_url=redis.url) as server, \
            joined(server, "held", sub=sub, client_id=client_id) as (tab, _):
        owner = RedisBackend(redis.url)
        try:
            assert await owner.claim_run("held", ended_claim("r-57", "owner-x"),
                                         LONG_LEASE_S) is None
            refused = await start(tab, "s1", "r-58", if_busy)
            assert (refused["type"], refused.get("code")) == ("error", "unavailable"), refused
            assert refused.get("retry_after_ms", 0) > 0, refused
            assert "r-57" in refused["message"], refused
            assert "another client" not in refused["message"], refused
            await owner.release_run("held", "r-57", "owner-x")  # Redis is back: freed
        finally:
            await owner.close()
        ack = await start(tab, "s2", "r-58", if_busy)
        assert (ack["type"], ack.get("run_id"), ack.get("status")) == \
            ("ack", "r-58", "running"), ack
        finished = await tab.recv_until(
            lambda e: e.get("type") == "run.finished" and e.get("run_id") == "r-58", timeout=15)
        assert finished["status"] == "completed", finished


async def test_an_ended_run_of_this_instance_that_it_could_not_free_is_freed_by_the_start(
        ) -> None:
    """This instance owns the ended run's claim (its driver gave up freeing it after half
    a lease of Redis away): the next start frees it, as the janitor would once the lease
    lapsed, and starts at once; the ended run's final record is written if missing."""
    async with redis_process() as redis, running_server(redis_url=redis.url) as server, \
            joined(server, "held", client_id="tab") as (tab, _):
        owner = RedisBackend(redis.url)
        try:
            assert await owner.claim_run("held", ended_claim(
                "r-57", server.services.instance_id), LONG_LEASE_S) is None
            ack = await start(tab, "s1", "r-58")
            assert (ack["type"], ack.get("run_id")) == ("ack", "r-58"), ack
            finished = await tab.recv_until(
                lambda e: e.get("type") == "run.finished" and e.get("run_id") == "r-58",
                timeout=15)
            assert finished["status"] == "completed", finished
            record = await owner.get_run_record("held", "r-57")
            assert record is not None and record["status"] == "completed", record
        finally:
            await owner.close()


async def test_a_run_still_active_on_another_instance_is_still_document_busy() -> None:
    """Unchanged: another client's run that has not ended gets `document_busy` naming it
    (its owner is alive and frees nothing)."""
    async with redis_process() as redis, running_server(redis_url=redis.url) as server, \
            joined(server, "held", sub="bob", client_id="other") as (tab, _):
        owner = RedisBackend(redis.url)
        try:
            assert await owner.claim_run("held", {**ended_claim("r-57", "owner-x"),
                                                  "status": "running"}, LONG_LEASE_S) is None
            refused = await start(tab, "s1", "r-58")
        finally:
            await owner.close()
        assert (refused["type"], refused.get("code"), refused.get("run_id")) == \
            ("error", "document_busy", "r-57"), refused


# The run's final record, written just before the document is freed (`RunLease.release`)
FINAL_RECORD = b'{"status":"completed","user_id"'


@pytest.mark.slow
async def test_the_tabs_next_start_after_its_run_could_not_free_the_document_starts_it(
        ) -> None:
    """As the chaos soak found it, with a real outage: the run ends, and Redis goes away
    (6 s, a 10 s lease) as its instance frees the document, which it gives up after half
    a lease. The tab's next `run.start`, sent as Redis is back, starts its run (once
    refused `unavailable` at most, then sent again); it was `document_busy` "of another
    client" until the lease lapsed, and the tab never retried it."""
    async with redis_process() as redis, \
            OutageProxy(redis.port, FINAL_RECORD, outage_s=6.0, forward=False) as proxy, \
            running_server(redis_url=proxy.url, run_lease_s=10) as server, \
            joined(server, "held", client_id="tab") as (tab, _):
        proxy.armed = True
        assert (await start(tab, "s1", "r-1"))["type"] == "ack"
        await tab.recv_until(lambda e: e.get("type") == "run.finished", timeout=15)
        await asyncio.wait_for(proxy.fired.wait(), 10)
        await asyncio.sleep(max(0.0, proxy.back_at - time.monotonic()) + 0.2)
        answers = []
        for attempt in range(1, 11):
            answers.append(reply := await start(tab, f"s2-{attempt}", "r-2"))
            if reply["type"] != "error" or reply["code"] != "unavailable":
                break
            await asyncio.sleep(reply["retry_after_ms"] / 1000)
        assert [a.get("code") for a in answers if a["type"] == "error"].count(
            "document_busy") == 0, answers
        assert answers[-1]["type"] == "ack", answers
        finished = await tab.recv_until(
            lambda e: e.get("type") == "run.finished" and e.get("run_id") == "r-2", timeout=15)
        assert finished["status"] == "completed", finished
