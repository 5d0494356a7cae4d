"""`COWRITE_DURABLE_RUNS=0`: Redis mode with 1.0's behaviour (no checkpoints), the
baseline of the checkpoint-cost benchmark (`bench.durable`). A client must be able
to tell: `durable_runs` is not announced, and a killed owner's run ends
`aborted`/`server_lost` instead of being taken over."""

import asyncio

import pytest

from tests.runs import call, script
from tests.test_multi_instance import FAST_LEASE, cluster, join, start_run

pytestmark = pytest.mark.redis


async def test_without_durable_runs_a_killed_owners_run_ends_server_lost() -> None:
    env = {**FAST_LEASE, "COWRITE_DURABLE_RUNS": "0"}
    async with cluster(env=env) as (_, (one, two)), \
            join(two, sub="bob", client_id="watch") as (watcher, welcome):
        assert "durable_runs" not in welcome["features"]
        assert "run_queue" in welcome["features"]  # the other features stay
        async with join(one) as (doomed, mine):
            assert "durable_runs" not in mine["features"]
            await start_run(doomed, script({"tool_calls": [call("read_document")]},
                                           {"say": "after"}), "off-1")
            tool_call = await doomed.recv_until("tool.call")
            one.process.kill()  # kill -9
            await doomed.expect_close()
        finished = await watcher.recv_until("run.finished", timeout=10)
        assert (finished["run_id"], finished["status"], finished["reason"]) == (
            "off-1", "aborted", "server_lost")
        done = [e for e in watcher.events if e.get("type") == "tool.done"]
        assert [(d["call_id"], d["status"]) for d in done] == [
            (tool_call["call_id"], "cancelled")]
        await asyncio.sleep(0.5)  # a second janitor pass changes nothing
        types = [e.get("type") for e in watcher.events]
        assert "run.resumed" not in types and types.count("run.finished") == 1
