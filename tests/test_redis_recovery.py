"""Instances and Redis coming apart and back together: a pub/sub connection cut, an
outage longer than a lease, Redis coming back without its data. Real instances
(subprocesses) on a real redis-server; each case was reproduced failing first."""

import asyncio
import contextlib
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import redis.asyncio as aioredis

from bench.common import Proc, server_process
from server.backends.base import BackendUnavailable
from server.backends.redis import RedisBackend
from tests.cluster_support import FAST_LEASE, cluster, ended, instance, join, start_run
from tests.harness import SECRET, Client
from tests.redis_support import RedisProcess, redis_process
from tests.runs import call, script

pytestmark = pytest.mark.redis


async def ready(proc: Proc) -> None:
    """Until the instance answers /readyz 200 (its Redis connection works again)."""
    async with httpx.AsyncClient() as http:
        for _ in range(100):
            if (await http.get(proc.url("/readyz", "http"))).status_code == 200:
                return
            await asyncio.sleep(0.1)
    raise AssertionError("the instance did not become ready again")


async def answer(client: Client, tool_call: dict[str, Any], request_id: str) -> dict[str, Any]:
    await client.send({"type": "tool.result", "id": request_id, "run_id": tool_call["run_id"],
                       "call_id": tool_call["call_id"], "token": tool_call["token"],
                       "output": {"text": "the document"}})
    return await client.recv_until(lambda e: e.get("reply_to") == request_id, timeout=10)


async def test_a_reconnected_subscriber_catches_up_on_other_instances_events() -> None:
    async with cluster() as (redis, (one, two)), join(one, client_id="x") as (x, _), \
            join(two, sub="bob", client_id="y") as (y, _):
        async with aioredis.Redis(port=redis.port) as admin:
            # A network blip that lasts: the subscribers are cut off and cannot come back
            # while instance two logs a whole run.
            await admin.execute_command(  # type: ignore[no-untyped-call]
                "ACL", "SETUSER", "default", "-subscribe")
            await admin.client_kill_filter(_type="pubsub")
            await start_run(y, script({"say": "from the other instance"}), "r-1")
            await y.recv_until("run.finished", timeout=10)
            await admin.execute_command(  # type: ignore[no-untyped-call]
                "ACL", "SETUSER", "default", "+subscribe")
        # Nothing else happens on the document: instance one must read what it missed
        # itself (it used to wait for a later event to show the gap).
        finished = await x.recv_until("run.finished", timeout=10)
        assert finished["run_id"] == "r-1"
        delivered = [e["seq"] for e in x.events if "seq" in e]
        assert delivered == sorted(set(delivered)) and delivered[-1] == finished["seq"]


async def test_an_outage_longer_than_the_lease_leaves_an_instances_runs_alive() -> None:
    async with redis_process() as redis, instance(redis, FAST_LEASE) as one, \
            contextlib.AsyncExitStack() as stack:
        runs = []
        for n in range(4):
            client, _ = await stack.enter_async_context(join(one, f"doc-{n}", client_id="t"))
            await start_run(client, script({"tool_calls": [call("read_document")]},
                                           {"say": "done"}), f"run-{n}")
            runs.append((client, await client.recv_until("tool.call", timeout=10)))
        await redis.stop()
        await asyncio.sleep(3)  # three leases
        await redis.start()
        await ready(one)
        await asyncio.sleep(2.5)  # the janitor finds the lapsed leases: they are its own
        for n, (client, tool_call) in enumerate(runs):
            acked = await answer(client, tool_call, f"result-{n}")
            # no `unavailable` either: stale pooled connections were dropped on reconnect
            assert acked["type"] == "ack" and acked["status"] == "accepted", acked
            finished = await client.recv_until("run.finished", timeout=10)
            assert finished["status"] == "completed", finished  # was aborted/server_lost


async def test_redis_losing_its_data_resets_the_connections_and_the_run_goes_on() -> None:
    async with redis_process() as redis, instance(redis, FAST_LEASE) as one:
        async with join(one, client_id="x") as (x, welcome):
            await start_run(x, script({"tool_calls": [call("read_document")]},
                                      {"say": "after the loss"}), "r-lost")
            tool_call = await x.recv_until("tool.call", timeout=10)
            await _lose_everything(redis)
            # The open connection is told to resume (its seqs no longer match the log's)
            # instead of silently missing the new log's first events.
            assert await x.expect_close(timeout=15) == 1011
        resume = {"epoch": welcome["epoch"], "after_seq": tool_call["seq"]}
        async with join(one, client_id="x", resume=resume) as (again, back):
            assert back["resume_failed"] == "epoch_changed" and back["epoch"] != welcome["epoch"]
            active = back["active_run"]
            for _ in range(50):  # the owner claims its lost run again at its next renewal
                if active is not None:
                    break
                await asyncio.sleep(0.1)
                async with join(one, sub="bob", client_id="probe") as (_, probe):
                    active = probe["active_run"]
            assert active is not None and active["run_id"] == "r-lost"
            acked = await answer(again, tool_call, "late")
            assert acked["type"] == "ack" and acked["status"] == "accepted", acked
            finished = await again.recv_until("run.finished", timeout=10)
            assert finished["run_id"] == "r-lost" and finished["status"] == "completed"


async def _lose_everything(redis: RedisProcess) -> None:
    """A restart that kept nothing (no persistence, or a failover to an empty replica)."""
    await redis.stop()
    _wipe(Path(redis.directory))
    await redis.start()


def _wipe(directory: Path) -> None:
    for path in directory.rglob("*"):
        if path.is_file():
            path.unlink()


async def test_an_instance_whose_clock_runs_ahead_takes_no_healthy_run_over() -> None:
    """Leases are stamped with Redis's clock: an instance 5 s ahead (lease 2 s) saw
    another's live runs as lapsed and took them over (`run.resumed`: owner_lost)."""
    lease = {"COWRITE_RUN_LEASE_S": "2"}
    async with redis_process() as redis, instance(redis, lease) as one, \
            server_process("skewed", COWRITE_REDIS_URL=redis.url, COWRITE_JWT_SECRET=SECRET,
                           SKEW_S="5", **lease):
        async with join(one, client_id="x") as (x, _):
            await start_run(x, script({"tool_calls": [call("read_document")]}, {"say": "ok"}),
                            "healthy")
            tool_call = await x.recv_until("tool.call", timeout=10)
            await asyncio.sleep(4)  # two leases: the ahead instance's janitor looked 8 times
            acked = await answer(x, tool_call, "result")
            assert acked["type"] == "ack" and acked["status"] == "accepted", acked
            finished = await x.recv_until("run.finished", timeout=10)
            assert finished["status"] == "completed"
            assert not [e for e in x.events if e.get("type") == "run.resumed"]


async def test_a_log_deleted_while_redis_stays_up_resets_every_instances_connections() -> None:
    """The document's log keys deleted (or evicted) with Redis still up: only the
    instance appending the next event used to notice the new epoch; a tab on another
    instance stayed open and took the new log's events for the old one's (its first
    events dropped as duplicates, the rest numbered on from the old log's)."""
    change = {"type": "editor.change", "origin": "user", "document_version": 1}
    async with cluster() as (redis, (one, two)), join(one, client_id="x") as (x, _), \
            join(two, sub="bob", client_id="y") as (y, old):
        for _ in range(3):
            await x.send(change)
            await y.recv_until("document.changed", timeout=10)
        async with aioredis.Redis(port=redis.port) as admin:
            await admin.delete("cw:{doc-1}:meta", "cw:{doc-1}:log")
        # A tab joining now follows the new log from its start: it must not be reset.
        async with join(two, sub="carol", client_id="z") as (z, new):
            assert new["epoch"] != old["epoch"] and new["last_seq"] == 0
            await x.send(change)  # the new log's first event
            assert await x.expect_close(timeout=10) == 1011
            assert await y.expect_close(timeout=10) == 1011
            first = await z.recv_until("document.changed", timeout=10)
            assert first["seq"] == 1
            await z.send({"type": "ping", "ts": 7})
            assert (await z.recv_until("pong", timeout=10))["ts"] == 7
        resume = {"epoch": old["epoch"], "after_seq": old["last_seq"] + 3}
        async with join(two, sub="bob", client_id="y", resume=resume) as (_, back):
            assert back["resume_failed"] == "epoch_changed" and back["last_seq"] == 1


async def test_a_tab_joining_before_the_owner_frees_an_ended_run_is_not_shown_it() -> None:
    """An owner frees its run's record just after logging `run.finished`. A tab joining
    another instance in between, before that event came through pub/sub, was told
    the run was active, and never heard it end (the event was before its welcome's
    `last_seq`). The window is held open here by putting the record back."""
    async with cluster() as (redis, (one, two)), join(one, client_id="x") as (x, _):
        await start_run(x, script({"tool_calls": [call("read_document")]}, {"say": "ok"}),
                        "r-1")
        tool_call = await x.recv_until("tool.call", timeout=10)
        async with aioredis.Redis(port=redis.port) as admin:
            record = await admin.get("cw:{doc-1}:active")
            assert record is not None
            await answer(x, tool_call, "result")
            await x.recv_until(ended("r-1"), timeout=10)
            for _ in range(100):  # the owner frees it just after
                if await admin.get("cw:{doc-1}:active") is None:
                    break
                await asyncio.sleep(0.05)
            await admin.set("cw:{doc-1}:active", record)
            try:
                async with join(two, sub="bob", client_id="late") as (_, welcome):
                    assert welcome.get("active_run") is None, welcome["active_run"]
            finally:
                await admin.delete("cw:{doc-1}:active")


async def test_a_malformed_or_previous_release_live_frame_does_not_stop_the_fan_out() -> None:
    """Live frames carry their epoch now; one in the previous release's `seq type frame`
    form (a rolling upgrade) or one that is neither ended an instance's pub/sub loop
    for good: its tabs heard nothing more from other instances."""
    change = {"type": "editor.change", "origin": "user", "document_version": 1}
    async with cluster() as (redis, (one, two)), join(one, client_id="x") as (x, _), \
            join(two, sub="bob", client_id="y") as (y, _):
        await x.send(change)
        first = await y.recv_until("document.changed", timeout=10)
        async with aioredis.Redis(port=redis.port, decode_responses=True) as admin:
            old = orjson.dumps({"type": "document.changed", "seq": first["seq"],
                                "ts": 1}).decode()
            assert await admin.publish("cw:live:{doc-1}", "not a frame") == 2
            assert await admin.publish(  # the previous release's form (a seq already seen)
                "cw:live:{doc-1}", f"{first['seq']} document.changed {old}") == 2
        await x.send({**change, "document_version": 2})
        after = await y.recv_until(lambda e: e.get("type") == "document.changed"
                                   and e["seq"] > first["seq"], timeout=10)
        assert (after["seq"], after["document_version"]) == (first["seq"] + 1, 2)


async def test_a_tab_connected_through_a_long_outage_is_present_at_once_after_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Instance B's tab stays connected while Redis is frozen for longer than B's
    heartbeat and its presence entry's own expiry; the run's owner A asks (its grace
    re-check) right after Redis is back. It was told "gone" (the run ended
    aborted/client_gone): B's heartbeat had lapsed, and the lapsed entry, deleted by the
    check, was never added back (renewed with ZADD XX). Two backends in this process,
    their clocks short; B has no janitor here, only its renewal."""
    renewal = sys.modules[RedisBackend._renew_loop.__module__]
    monkeypatch.setattr(renewal, "CONNECTION_TTL_S", 1.0)
    monkeypatch.setattr(renewal, "RENEW_EVERY_S", 0.3)
    monkeypatch.setattr(renewal, "RENEW_RETRY_S", 0.2, raising=False)
    monkeypatch.setattr(renewal, "OUTAGE_GRACE_S", 1.0, raising=False)
    async with redis_process() as redis, backend(redis.url) as owner, \
            backend(redis.url) as other:
        await owner.heartbeat("A", 2.0)
        await other.heartbeat("B", 2.0)
        await other.set_presence("doc", "alice|tab|conn-1", True)
        assert await owner.is_present("doc", "alice", "tab")
        assert redis.process is not None
        redis.process.send_signal(signal.SIGSTOP)
        try:
            await asyncio.sleep(3.0)  # past B's heartbeat (2 s) and the entry's expiry (1 s)
            with pytest.raises(BackendUnavailable):  # a check during the outage
                await owner.is_present("doc", "alice", "tab")
        finally:
            redis.process.send_signal(signal.SIGCONT)
        deadline = time.monotonic() + 1.8  # past the grace; B's heartbeat lives 2 s
        while time.monotonic() < deadline:
            assert await owner.is_present("doc", "alice", "tab")
            await asyncio.sleep(0.1)
        await other.set_presence("doc", "alice|tab|conn-1", False)  # the tab goes now
        assert not await owner.is_present("doc", "alice", "tab")


@contextlib.asynccontextmanager
async def backend(url: str) -> AsyncIterator[RedisBackend]:
    started = RedisBackend(url, op_timeout_s=0.3)
    await started.start()
    try:
        yield started
    finally:
        await started.close()
