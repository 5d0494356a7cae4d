"""A drain (SIGTERM) that cannot ask Redis who else lives hands its runs over.

`begin_drain` asks Redis for the live instances: another one takes the runs over
(`run.resumed` `handoff`), none means they end `aborted`/`server_shutdown`. When
that question failed (Redis away for a moment), the answer was "none", and a run
another instance could have gone on with ended `server_shutdown` (PROTOCOL
section 13: not while any instance lives; a chaos soak, `python -m tests.chaos`,
ended 3 of 3,645 runs so). Not knowing, the instance now hands its runs over: a
survivor takes them when their lease lapses, or the next instance to start does.
The question is lost for real: a proxy cuts the connection that carries it."""

import asyncio

import pytest

from server.lifecycle import drain
from tests.harness import joined, running_server
from tests.kill_proxy import DropReplyProxy
from tests.redis_support import redis_process
from tests.runs import call, script, start

pytestmark = [pytest.mark.redis]
# The live-instances question as it goes over the wire (not a Lua script's text).
LIVE_INSTANCES = b"ZRANGEBYSCORE\r\n$12\r\ncw:instances"


async def test_a_drain_that_cannot_ask_who_lives_hands_its_run_over() -> None:
    prompt = script({"tool_calls": [call("read_document")]}, {"say": "after"})
    async with redis_process() as redis, DropReplyProxy(redis.port, LIVE_INSTANCES) as proxy, \
            running_server(redis_url=proxy.url, run_lease_s=1) as one, \
            running_server(redis_url=redis.url, run_lease_s=1) as two, \
            joined(two, "drained", sub="bob", client_id="watcher") as (watcher, _):
        async with joined(one, "drained", client_id="tab") as (tab, _):
            ack = await start(tab, prompt)
            await watcher.recv_until("tool.call")
            proxy.armed = True
            await asyncio.wait_for(drain(one.services, timeout_s=5.0), 30)
            assert proxy.fired.is_set()
        resumed = await watcher.recv_until(
            lambda e: e.get("type") in ("run.resumed", "run.finished"), timeout=15)
        assert resumed["type"] == "run.resumed", resumed  # was run.finished server_shutdown
        assert resumed["run_id"] == ack["run_id"]
        async with joined(two, "drained", client_id="tab-2") as (owner, _):
            await owner.send({"type": "run.cancel", "id": "c", "run_id": ack["run_id"]})
            finished = await owner.recv_until("run.finished", timeout=15)
        assert (finished["status"], finished.get("reason")) != ("aborted", "server_shutdown")
