"""A run that becomes active on a draining instance after its runs were handed over is
handed over too, not ended `aborted`/`server_shutdown` while another instance lives.

A drain (SIGTERM) asks Redis who else lives and, with a survivor, hands over the runs
active at that moment (`run.resumed` `handoff` on the survivor). Its connections stay
open until it closes them, and a `run.start` that arrived on one meanwhile (a tab
starting its next run just after the last one finished) still started here. The
process's last step then ended every run still active `aborted`/`server_shutdown`,
although a survivor could go on with it (PROTOCOL section 13: not while any instance
lives; the chaos soak, `python -m tests.chaos`, ended 1-4 runs a soak so, the draining
instance having seen two live peers each time). The window is pinned here: the run
starts on the instance after `drain` returned, before the instance stops."""

import asyncio

import pytest

from server.lifecycle import drain
from tests.harness import joined, running_server
from tests.redis_support import redis_process
from tests.runs import call, script, start

pytestmark = [pytest.mark.redis]


async def test_a_run_started_while_draining_is_handed_over_not_ended() -> None:
    prompt = script({"tool_calls": [call("read_document")]}, {"say": "after"})
    async with redis_process() as redis, \
            running_server(redis_url=redis.url, run_lease_s=1) as two, \
            joined(two, "late", sub="bob", client_id="watcher") as (watcher, _):
        async with running_server(redis_url=redis.url, run_lease_s=1) as one:
            await asyncio.wait_for(drain(one.services, timeout_s=5.0), 30)  # two lives
            async with joined(one, "late", client_id="tab") as (tab, _):
                ack = await start(tab, prompt)  # on the draining instance, after its drain
                await watcher.recv_until("tool.call")
        # `one` has stopped: its run went to `two` instead of ending
        moved = await watcher.recv_until(
            lambda e: e.get("type") in ("run.resumed", "run.finished"), timeout=15)
        assert moved["type"] == "run.resumed", moved  # was run.finished server_shutdown
        assert (moved["run_id"], moved["reason"]) == (ack["run_id"], "handoff")
        async with joined(two, "late", client_id="tab-2") as (owner, _):
            await owner.send({"type": "run.cancel", "id": "c", "run_id": ack["run_id"]})
            finished = await owner.recv_until("run.finished", timeout=15)
        assert (finished["status"], finished.get("reason")) != ("aborted", "server_shutdown")
