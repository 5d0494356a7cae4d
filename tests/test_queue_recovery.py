"""A queue whose document has no active run is started by a janitor (PROTOCOL.md section
12, Redis): the instance where the active run ended starts the next one, but not while it
shuts down, and not after it died. Real `python -m server` instances on a real
redis-server."""

import asyncio

import httpx
import pytest

from tests.cluster_support import FAST_LEASE, ended, instance, join, start_run
from tests.harness import token
from tests.redis_support import redis_process
from tests.runs import call, script

pytestmark = [pytest.mark.redis, pytest.mark.slow]
WAITS = script({"tool_calls": [call("read_document")]}, {"say": "done"})


async def test_a_queue_left_by_an_instance_that_shut_down_starts_after_its_restart() -> None:
    """One instance, SIGTERM while Alice's run is active and Bob's waits: Alice's run
    ends `server_shutdown`, and Bob's stayed queued after the restart (every new tab was
    told so) until somebody else started a run."""
    async with redis_process() as redis:
        async with instance(redis, FAST_LEASE) as first, join(first) as (alice, _), \
                join(first, sub="bob", client_id="b") as (bob, _):
            await start_run(alice, WAITS, "a-1")
            await alice.recv_until("tool.call")
            await bob.send({"type": "run.start", "id": "q", "run_id": "b-1",
                            "prompt": script({"say": "my turn"}), "tools": [],
                            "options": {"if_busy": "enqueue"}})
            assert (await bob.recv_until(lambda e: e.get("reply_to") == "q"))["status"] == \
                "queued"
            first.process.terminate()
            shut = await bob.recv_until(ended("a-1"), timeout=15)
            assert (shut["status"], shut["reason"]) == ("aborted", "server_shutdown")
            await first.process.wait()
        async with instance(redis, FAST_LEASE) as second, httpx.AsyncClient() as http:
            history = second.url("/v1/documents/doc-1/history", scheme="http")
            auth = {"Authorization": f"Bearer {token('carol')}"}
            async with asyncio.timeout(15):  # Bob's run, started by the new instance
                while not any(  # noqa: ASYNC110 - polled over HTTP
                        m["run_id"] == "b-1" and m["role"] == "assistant" for m in (
                        await http.get(history, headers=auth)).json()["messages"]):
                    await asyncio.sleep(0.1)
            async with join(second, sub="carol", client_id="c") as (_, welcome):
                assert welcome["queued_runs"] == [] and welcome.get("active_run") is None
