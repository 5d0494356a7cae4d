"""A running run's decision that waits out a Redis outage, when Redis comes back
without the run (a failover to a replica that lacked it), with a real redis-server
taken away by a proxy at the decision's own write and an in-process server.

A decision whose events are logged before its checkpoint (a person's edit outside a
scoped run's scope, with durable runs off: its `run.scope`) is not fenced by the
lease. Retried through the outage (`server/agent/commit.py`), its checked write found
the lease gone and the run was let go as if another instance had taken it over; but
nobody had, and the record was gone too: no `run.finished`, ever, and the tab's
pending call answered `run_not_found`. The run is now claimed again, as a fenced
decision's is, and goes on."""

import asyncio

import pytest

from tests.harness import joined, running_server
from tests.redis_support import redis_process
from tests.test_edit_scope import scoped_run
from tests.test_outage_gaps import OutageProxy, _lose_the_run

pytestmark = [pytest.mark.redis, pytest.mark.slow]
LEASE_S = 6.0


async def test_a_run_redis_lost_while_its_decision_waited_out_the_outage_goes_on() -> None:
    async with redis_process() as redis, \
            OutageProxy(redis.port, b'"type":"run.scope"', outage_s=9.0,
                        forward=False) as proxy, \
            running_server(redis_url=proxy.url, run_lease_s=LEASE_S,
                           durable_runs=False) as server, \
            joined(server) as (alice, _):
        ack = await scoped_run(alice, "overlap", [{"from": 20, "to": 30}])
        run_id, pending = ack["run_id"], ack["pending"]
        proxy.armed = True  # the edit's run.scope is the write that meets the outage
        await alice.send({"type": "editor.change", "id": "e1", "document_version": 2,
                          "origin": "user", "changes": [{"from": 0, "to": 0, "insert": 3}]})
        await asyncio.wait_for(proxy.fired.wait(), 10)
        await asyncio.sleep(1.0)  # into the outage, then Redis loses the run
        await _lose_the_run(redis.port, "doc-1", run_id)  # and comes back without it
        answered = await alice.recv_until(lambda e: e.get("reply_to") == "e1", timeout=20)
        assert answered["type"] == "error" and answered["code"] == "unavailable"
        scope = await alice.recv_until(
            lambda e: e.get("run_id") == run_id and e["type"] in ("run.scope", "run.finished"),
            timeout=30)
        assert scope["type"] == "run.scope", scope  # logged once Redis was back
        for reply_to in ("r1", "r2"):  # the script asks for two reads, then says "done"
            await alice.send({"type": "tool.result", "id": reply_to, "run_id": run_id,
                              "call_id": pending["call_id"], "token": pending["token"],
                              "output": {"text": "doc"}})
            reply = await alice.recv_until("ack", timeout=15)
            assert reply["reply_to"] == reply_to, reply
            if reply_to == "r1":
                pending = await alice.recv_until("tool.call", timeout=15)
        finished = await alice.recv_until(
            lambda e: e.get("run_id") == run_id and e["type"] == "run.finished", timeout=30)
        assert finished["status"] == "completed"
        assert [e["type"] for e in alice.events].count("run.scope") == 1
