"""A `run.start` sent again while its first attempt's claim is still held.

An instance claims the document for a run, then dies before the run begins (no
`run.started`, no checkpoint). Its client, whose `run.start` got no answer, sends
it again, same `run_id`, through another instance. That instance took the claim
for "the same client's other run" and waited for it to be superseded; the janitor
meanwhile ended the claimed run `aborted`/`server_lost` and freed the document,
and the repeat then started the very run that had just ended: `run.started` after
its `run.finished`, two `run.finished` (found once by `python -m tests.chaos`). A
run.start whose `run_id` is the claim's own is a repeat: answered `duplicate`.
The dead instance's claim is written into a real redis-server as it writes it."""

import pytest

from server.backends.redis import RedisBackend
from tests.harness import joined, running_server
from tests.redis_support import redis_process
from tests.runs import script

pytestmark = [pytest.mark.redis]


async def test_a_repeated_start_of_a_run_claimed_by_a_dead_instance_is_a_duplicate() -> None:
    async with redis_process() as redis, \
            running_server(redis_url=redis.url, run_lease_s=1) as survivor, \
            joined(survivor, "claimed", client_id="tab") as (tab, _):
        ghost = RedisBackend(redis.url)
        try:  # what the dead instance left: the claim of a run it never began
            assert await ghost.claim_run("claimed", {
                "run_id": "r-1", "status": "running", "mode": "agent", "user_id": "alice",
                "client_id": "tab", "step": 0, "pending": [], "owner": "ghost"}, 1.0) is None
        finally:
            await ghost.close()
        await tab.send({"type": "run.start", "id": "again", "run_id": "r-1",
                        "prompt": script({"say": "hi"})})
        answer = await tab.recv_until(lambda e: e.get("reply_to") == "again", timeout=15)
        assert (answer["type"], answer.get("duplicate")) == ("ack", True), answer
        finished = await tab.recv_until("run.finished", timeout=15)
        assert (finished["run_id"], finished["status"], finished["reason"]) == \
            ("r-1", "aborted", "server_lost")
        await tab.send({"type": "ping", "id": "p"})
        await tab.recv_until("pong")
        of_run = [e for e in tab.events if e.get("run_id") == "r-1" and "seq" in e]
        assert [e["type"] for e in of_run] == ["run.finished"]  # never begun after its end
