"""A plain append whose reply is lost (Redis did it; the connection broke before the
answer came back) is tried again under the same write id and logged once: a run's
end (PROTOCOL.md: exactly one `run.finished`) and the held text of a stream. Real
redis-server behind `DropReplyProxy`, the server in this process."""

import asyncio
from typing import Any, cast

import orjson
import pytest
import redis.asyncio as aioredis

from protocol.server import DurableServerEvent, Limits, MessageDone, RunFinished
from server.agent.publishing import publish_retrying
from server.backends.base import BackendUnavailable
from server.backends.redis import RedisBackend
from server.ports import RunHandler
from server.session import DocumentSession
from tests.harness import Client, joined, running_server
from tests.kill_proxy import DropReplyProxy
from tests.redis_support import redis_process
from tests.runs import of_run, script, start

pytestmark = pytest.mark.redis


async def _log(port: int, document_id: str) -> list[dict[str, Any]]:
    """Every event of the document's log, as stored."""
    async with aioredis.Redis(port=port, decode_responses=True) as admin:
        entries: Any = await admin.xrange(f"cw:{{{document_id}}}:log")
    return [orjson.loads(fields["f"]) for _id, fields in entries]


async def _settle(client: Client, run_id: str) -> None:
    """Until the run's end, then a moment more (a second end would come by then)."""
    await client.recv_until(lambda e: e.get("type") == "run.finished"
                            and e.get("run_id") == run_id, timeout=15)
    await asyncio.sleep(1.0)


async def test_a_runs_end_whose_reply_is_lost_is_logged_once() -> None:
    async with redis_process() as redis, \
            DropReplyProxy(redis.port, b'"type":"run.finished"') as proxy, \
            running_server(redis_url=proxy.url, run_lease_s=3.0) as server, \
            joined(server) as (alice, _):
        proxy.armed = True
        await start(alice, script({"say": "hello there"}), run_id="r-1", tools=[])
        await _settle(alice, "r-1")
        assert proxy.fired.is_set()
        logged = await _log(redis.port, "doc-1")
        ends = [e for e in logged if e["type"] == "run.finished"]
        assert len(ends) == 1, ends  # was two: the retry of `publish_retrying` logged it again
        assert ends[0]["status"] == "completed"
        assert [e["seq"] for e in logged] == list(range(1, len(logged) + 1))
        assert len(of_run(alice.events, "r-1", "run.finished")) == 1


DONE = MessageDone(run_id="r", message_id="r:m1", text="hello")
FINISHED = RunFinished(run_id="r", status="completed", steps=1)


@pytest.mark.parametrize("group", [(FINISHED,), (DONE, FINISHED)], ids=["alone", "second"])
async def test_a_group_whose_reply_is_lost_is_logged_once(
        group: tuple[DurableServerEvent, ...]) -> None:
    """A run's end without a checkpoint (a crash's, a queued run's): a group's first event
    is tried again by `publish_retrying` (the whole group again), a later one by the
    group itself (`log_groups`); both logged `run.finished` twice."""
    async with redis_process() as redis, \
            DropReplyProxy(redis.port, b'"type":"run.finished"') as proxy:
        backend = RedisBackend(proxy.url)
        await backend.start()
        try:
            session = DocumentSession("d", backend, Limits(
                max_message_bytes=1 << 20, tool_timeout_s=60, run_timeout_s=600, max_steps=20),
                lambda _session: cast(RunHandler, None))
            await backend.append("other", {"type": "document.changed"})  # the script loaded:
            proxy.armed = True  # else the EVALSHA cut is one Redis refused (NOSCRIPT)
            await publish_retrying(session, group, 3.0, {})
            assert proxy.fired.is_set()
            logged = await _log(redis.port, "d")
            assert [e["type"] for e in logged] == [e.type for e in group]
            assert [e["seq"] for e in logged] == list(range(1, len(group) + 1))
        finally:
            await backend.close()


async def test_held_text_whose_reply_is_lost_is_logged_once() -> None:
    """The marker is in the middle of a streamed message: the held delta carrying it is
    put back after the lost reply and tried again, while more text arrives."""
    async with redis_process() as redis, DropReplyProxy(redis.port, b"ZZMK") as proxy, \
            running_server(redis_url=proxy.url, run_lease_s=3.0) as server, \
            joined(server) as (alice, _):
        # the prompt spells the marker escaped, so only the streamed text carries it
        prompt = script({"say": "abcdZZMKefgh"}, delay_ms=300).replace("ZZMK", "ZZ\\u004dK")
        await start(alice, prompt, run_id="r-2", tools=[])
        await alice.recv_until("message.delta", timeout=10)
        proxy.armed = True
        await _settle(alice, "r-2")
        assert proxy.fired.is_set()
        logged = await _log(redis.port, "doc-1")
        streamed = "".join(e["delta"] for e in logged if e["type"] == "message.delta")
        done = [e for e in logged if e["type"] == "message.done"]
        assert len(done) == 1 and done[0]["text"] == "abcdZZMKefgh"
        assert streamed == done[0]["text"]  # was "abcdZZMKZZMKefgh": the held text twice
        assert len([e for e in logged if e["type"] == "run.finished"]) == 1


async def test_append_once_answers_the_first_attempts_seq() -> None:
    async with redis_process() as redis, DropReplyProxy(redis.port, b"lost-once") as proxy:
        backend = RedisBackend(proxy.url)
        await backend.start()
        try:
            await backend.append_once("d", {"type": "document.changed", "n": 0}, "w-0")
            proxy.armed = True
            with pytest.raises(BackendUnavailable):
                await backend.append_once("d", {"type": "document.changed", "n": "lost-once"},
                                          "w-1")
            again = await backend.append_once("d", {"type": "document.changed",
                                                    "n": "lost-once"}, "w-1")
            assert again.seq == 2 and orjson.loads(again.frame)["n"] == "lost-once"
            other = await backend.append_once("d", {"type": "document.changed", "n": 2}, "w-2")
            plain = await backend.append("d", {"type": "document.changed", "n": 3})
            assert (other.seq, plain.seq) == (3, 4)
            assert [e["n"] for e in await _log(redis.port, "d")] == [0, "lost-once", 2, 3]
        finally:
            await backend.close()
