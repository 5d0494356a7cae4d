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
from tests.kill_proxy import DelayReplyProxy, DropReplyProxy
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


async def test_a_write_id_is_logged_once_whoever_tries_it_again() -> None:
    """Another instance's janitor ending the same orphan, or a group retried whole after
    a later event failed, tries an id whose first attempt succeeded: it was looked up
    only after this process saw that id fail, so such a retry logged a second
    `tool.done`."""
    async with redis_process() as redis:
        one, two = RedisBackend(redis.url), RedisBackend(redis.url)
        await one.start()
        await two.start()
        try:
            first = await one.append_once("d", {"type": "document.changed", "n": 1}, "w-1")
            again = await one.append_once("d", {"type": "document.changed", "n": 1}, "w-1")
            elsewhere = await two.append_once("d", {"type": "document.changed", "n": 1}, "w-1")
            assert first.seq == again.seq == elsewhere.seq == 1
            assert [e["n"] for e in await _log(redis.port, "d")] == [1]
        finally:
            await one.close()
            await two.close()


async def test_the_write_ids_kept_stay_bounded_and_expire() -> None:
    """Ids were trimmed and given their TTL only on every 32nd seq: a run whose
    appends with an id never fell on one (plain appends and checkpointed groups carry
    none) grew the set by one per step, with no TTL."""
    async with redis_process() as redis:
        backend = RedisBackend(redis.url)
        await backend.start()
        try:
            for n in range(600):  # an id on every other seq, never on one of 32k + 1
                await backend.append("d", {"type": "document.changed", "n": n})
                await backend.append_once("d", {"type": "document.changed", "n": n}, f"w-{n}")
            async with aioredis.Redis(port=redis.port) as admin:
                kept = await admin.zcard("cw:{d}:writes")
                ttl = await admin.pttl("cw:{d}:writes")
            assert 96 <= kept <= 96 + 32, kept  # was 600
            assert ttl > 0, ttl  # was -1: never expired
            again = await backend.append_once("d", {"type": "document.changed", "n": 599},
                                              "w-599")
            assert again.seq == 1200  # the newest ids are still answered
        finally:
            await backend.close()


async def test_a_queued_run_ended_unstarted_whose_reply_is_lost_ends_once() -> None:
    """An edit while a run waited in line ends it `aborted`; the end's append lost its
    reply and `_end_unstarted` tried it again under a new write id: two `run.finished`."""
    marker = b'"type":"run.finished","run_id":"q-1"'
    async with redis_process() as redis, DropReplyProxy(redis.port, marker) as proxy, \
            running_server(redis_url=proxy.url, run_lease_s=3.0) as server, \
            joined(server) as (alice, _), joined(server, client_id="b", sub="bob") as (bob, _):
        await start(alice, script({"tool_calls": [{"name": "read_document",
                                                   "arguments": {}}]}, {"say": "x"}),
                    run_id="r-1")
        await alice.recv_until("tool.call")
        await bob.send({"type": "run.start", "id": "q", "run_id": "q-1",
                        "prompt": script({"say": "queued"}), "tools": [],
                        "options": {"if_busy": "enqueue"}})
        assert (await bob.recv_until(lambda e: e.get("reply_to") == "q"))["type"] == "ack"
        proxy.armed = True
        await alice.send({"type": "editor.change", "document_version": 2, "origin": "user"})
        await bob.recv_until(lambda e: e.get("type") == "run.finished"
                             and e.get("run_id") == "q-1", timeout=15)
        await asyncio.sleep(1.5)
        assert proxy.fired.is_set()
        ends = [e for e in await _log(redis.port, "doc-1")
                if e["type"] == "run.finished" and e["run_id"] == "q-1"]
        assert len(ends) == 1, ends  # was two
        assert (ends[0]["status"], ends[0]["reason"]) == ("aborted", "document_changed")
        assert len(of_run(bob.events, "q-1", "run.finished")) == 1


async def test_a_welcome_while_a_tool_call_is_written_lists_it_as_pending() -> None:
    """Redis has logged a `tool.call` and its reply is still on the way: a tab joining
    then reads the head (the call in its replay) and the run's state (still the one
    before the call): `active_run` said `running` with no pending call, and a client
    that runs only replayed calls still listed there never ran it (the run waited out
    its tool timeout). The snapshot is taken from the state being written."""
    async with redis_process() as redis, \
            DelayReplyProxy(redis.port, b'"type":"tool.call"') as proxy, \
            running_server(redis_url=proxy.url, run_lease_s=30.0) as server, \
            joined(server) as (alice, _):
        proxy.armed = True
        await start(alice, script({"tool_calls": [{"name": "read_document",
                                                   "arguments": {}}]}, {"say": "x"}),
                    run_id="r-1")
        await asyncio.wait_for(proxy.fired.wait(), 10)
        await asyncio.sleep(0.3)  # Redis has done it; the reply is held
        calls = [e for e in await _log(redis.port, "doc-1") if e["type"] == "tool.call"]
        assert len(calls) == 1
        async with joined(server, client_id="tab-2") as (_, welcome):
            assert welcome["last_seq"] >= calls[0]["seq"]  # the call is in its replay
            active = welcome["active_run"]
            assert active["status"] == "waiting_tool", active  # was "running"
            assert [p["call_id"] for p in active["pending"]] == [calls[0]["call_id"]]
        proxy.release.set()
