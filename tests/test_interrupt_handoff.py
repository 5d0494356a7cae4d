"""An `interrupt` sent while the run it ends is being handed over (SIGTERM to its owner):
the sender was told `document_busy`, and the run was interrupted after all (the next
owner replays what the old one left unread, the interrupt included). Real instances on
a real redis-server."""

import asyncio

import pytest

from tests.cluster_support import cluster, ended, join
from tests.runs import EDITOR_TOOLS, call, script

pytestmark = [pytest.mark.redis, pytest.mark.slow]
# a janitor tick of 3 s (a quarter lease): the run stays handed over, nobody's, long
# enough for the interrupt to arrive in that state
LEASE = {"COWRITE_RUN_LEASE_S": "12", "COWRITE_JANITOR_INTERVAL_S": "3"}


async def test_an_interrupt_during_a_handover_starts_the_interrupters_run() -> None:
    steps = script({"tool_calls": [call("read_document")]}, {"say": "done"})
    async with cluster(3, env=LEASE) as (_, (owner, _spare, other)), \
            join(other, sub="bob", client_id="b") as (bob, _):
        async with join(owner, client_id="a") as (alice, _):
            await alice.send({"type": "run.start", "id": "s", "run_id": "r1",
                              "prompt": steps, "tools": EDITOR_TOOLS})
            await alice.recv_until("tool.call")
            await bob.recv_until("tool.call")
            owner.process.terminate()
            await asyncio.sleep(0.5)  # handed over; nobody has taken it yet
            await bob.send({"type": "run.start", "id": "int", "run_id": "b1",
                            "prompt": script({"say": "bob"}), "tools": [],
                            "options": {"if_busy": "interrupt"}})
            reply = await bob.recv_until(lambda e: e.get("reply_to") == "int", timeout=20)
        assert (reply["type"], reply.get("status")) == ("ack", "running"), reply
        interrupted = await bob.recv_until(ended("r1"), timeout=20)
        assert (interrupted["status"], interrupted["reason"]) == ("cancelled", "interrupted")
        assert (await bob.recv_until(ended("b1"), timeout=20))["status"] == "completed"
