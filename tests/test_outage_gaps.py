"""Durable runs through Redis outages: three gaps of the ending and the queue. Real
redis-server behind a proxy that takes Redis away at an exact command (after it ran:
the reply is lost), the server in this process."""

import asyncio
import hashlib
import time
from typing import Any

import orjson
import pytest
import redis.asyncio as aioredis

from server.backends.redis import RedisBackend
from server.backends.redis_queue import REMOVE_LUA
from server.backends.redis_scripts import APPEND_LUA
from tests.harness import joined, running_server
from tests.kill_proxy import _Proxy
from tests.redis_support import redis_process
from tests.runs import call, of_run, script, start

pytestmark = pytest.mark.redis
APPEND_SHA = hashlib.sha1(APPEND_LUA.encode()).hexdigest().encode()
REMOVE_SHA = hashlib.sha1(REMOVE_LUA.encode()).hexdigest().encode()


class OutageProxy(_Proxy):
    """Once `armed`, the first command holding every marker reaches Redis (unless not
    `forward`); then Redis is out of reach for `outage_s`: every connection is cut (that
    command's reply is lost) and new ones are refused."""

    def __init__(self, redis_port: int, *markers: bytes, outage_s: float,
                 forward: bool = True) -> None:
        super().__init__(redis_port, markers[0])
        self.markers, self.outage_s, self.forward = markers, outage_s, forward
        self.armed = False
        self._down_until = 0.0
        self._open: set[asyncio.StreamWriter] = set()

    async def __aenter__(self) -> "OutageProxy":
        await super().__aenter__()
        return self

    @property
    def back_at(self) -> float:
        return self._down_until

    @property
    def down(self) -> bool:
        return time.monotonic() < self._down_until

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
                     ) -> None:
        if self.down:
            writer.transport.abort()
            return
        self._open.add(writer)
        try:
            await super()._serve(reader, writer)
        finally:
            self._open.discard(writer)

    async def _up(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter,
                  cut: asyncio.Event) -> None:
        while data := await source.read(65536):
            if self.down:
                break
            fire = self.armed and not self.fired.is_set() and \
                all(marker in data for marker in self.markers)
            if fire:
                cut.set()  # its reply is dropped
            if self.forward or not fire:
                sink.write(data)
                await sink.drain()
            if fire:
                self.fired.set()
                await asyncio.sleep(0.05)  # done by Redis (`forward`), its reply unread
                self._down_until = time.monotonic() + self.outage_s
                for writer in list(self._open):
                    writer.transport.abort()
                break
        sink.transport.abort()


async def _log(port: int, document_id: str = "doc-1") -> list[dict[str, Any]]:
    async with aioredis.Redis(port=port, decode_responses=True) as admin:
        entries: Any = await admin.xrange(f"cw:{{{document_id}}}:log")
    return [orjson.loads(fields["f"]) for _id, fields in entries]


async def _lose_the_run(port: int, document_id: str, run_id: str) -> None:
    """Redis loses the run (a failover to a replica that lacked it): its record and
    lease go, the log stays."""
    async with aioredis.Redis(port=port) as admin:
        pipe = admin.pipeline(transaction=True)
        pipe.delete(f"cw:{{{document_id}}}:active", f"cw:{{{document_id}}}:owner",
                    f"cw:{{{document_id}}}:run-parts")
        pipe.hdel(f"cw:{{{document_id}}}:runs", run_id)
        pipe.zrem("cw:leases", document_id)
        await pipe.execute()


async def _freed(port: int, document_id: str, timeout: float = 20) -> None:
    async with aioredis.Redis(port=port) as admin:
        deadline = time.monotonic() + timeout
        while await admin.exists(f"cw:{{{document_id}}}:active"):
            assert time.monotonic() < deadline, "the document stayed busy"
            await asyncio.sleep(0.1)


def _reply_to(message_id: str) -> Any:
    return lambda e: e.get("reply_to") == message_id


def _ended(run_id: str) -> Any:
    return lambda e: e.get("type") == "run.finished" and e.get("run_id") == run_id


async def test_an_end_after_the_run_was_lost_and_an_outage_is_logged_once() -> None:
    """Redis lost the run's record; the user cancels: the end's checkpointed write is
    refused, the run is claimed again, and its events go as a plain group. That
    append ran but its reply was lost, and Redis stayed away past half a lease: the
    end was then tried as a checkpointed write under another write id, and logged
    `tool.done` and `run.finished` a second time."""
    async with redis_process() as redis, \
            OutageProxy(redis.port, APPEND_SHA, b'"type":"run.finished"',
                        outage_s=4.0) as proxy, \
            running_server(redis_url=proxy.url, run_lease_s=6.0) as server, \
            joined(server) as (alice, _):
        await start(alice, script({"tool_calls": [call("read_document")]}, {"say": "x"}),
                    run_id="r-1")
        await alice.recv_until("tool.call")  # the lease's first renewal is 2 s away
        await _lose_the_run(redis.port, "doc-1", "r-1")
        proxy.armed = True
        await alice.send({"type": "run.cancel", "id": "c", "run_id": "r-1"})
        reply = await alice.recv_until(_reply_to("c"), timeout=10)
        assert proxy.fired.is_set()
        await alice.recv_until(_ended("r-1"), timeout=20)
        await _freed(redis.port, "doc-1")  # the owner's end is done, however it went
        logged = await _log(redis.port)
        ends = [e for e in logged if e["type"] == "run.finished"]
        assert len(ends) == 1, ends  # was two
        assert ends[0]["status"] == "cancelled"
        assert len([e for e in logged if e["type"] == "tool.done"]) == 1
        assert [e["seq"] for e in logged] == list(range(1, len(logged) + 1))
        assert len(of_run(alice.events, "r-1", "run.finished")) == 1
        assert (reply["type"], reply["code"]) == ("error", "unavailable"), reply


async def test_a_checkpointed_write_and_a_plain_append_of_the_same_write_log_once() -> None:
    """A decision's events under its write id: appended alone first (Redis had lost the
    run), then with the checkpoint, or the other way round, each is logged once."""
    async with redis_process() as redis:
        backend = RedisBackend(redis.url)
        await backend.start()
        try:
            record = {"run_id": "r1", "status": "running", "owner": "instance-1"}
            assert await backend.claim_run("d", record, 10) is None
            events = [{"type": "tool.done", "run_id": "r1"},
                      {"type": "run.finished", "run_id": "r1"}]
            await backend.append_once("d", events[0], "w-1.0")  # the group, cut after one
            assert await backend.renew_and_append("d", {**record, "write": "w-1"}, 10, None,
                                                  events)
            assert [e["type"] for e in await _log(redis.port, "d")] == [
                "tool.done", "run.finished"]
            assert await backend.renew_and_append("d", {**record, "write": "w-2"}, 10, None,
                                                  events)
            again = await backend.append_once("d", events[1], "w-2.1")
            assert again.seq == 4
            assert [e["seq"] for e in await _log(redis.port, "d")] == [1, 2, 3, 4]
            assert await backend.renew_and_append("d", record, 10, None, events)  # no id
            assert len(await _log(redis.port, "d")) == 6
        finally:
            await backend.close()


@pytest.mark.parametrize("cut", ["removal_reply_lost", "end_not_logged"])
async def test_a_queued_run_cancelled_through_an_outage_ends_once_and_never_starts(
        cut: str) -> None:
    """Bob cancels his queued run as Redis goes away: its removal from the queue ran but
    its reply was lost, or it ran and its `run.finished` could not be logged. He was
    told `unavailable`, and the run was out of the queue with no end: it never started
    nor ended (its watchers saw `run.queued` only), and his retry was answered
    `run_not_active` "is queued". The end is now logged once Redis is back."""
    markers = (REMOVE_SHA, b"q-1") if cut == "removal_reply_lost" else \
        (APPEND_SHA, b'"type":"run.finished","run_id":"q-1"')
    async with redis_process() as redis, \
            OutageProxy(redis.port, *markers, outage_s=2.0,
                        forward=cut == "removal_reply_lost") as proxy, \
            running_server(redis_url=proxy.url, run_lease_s=3.0) as server, \
            joined(server) as (alice, _), joined(server, client_id="b", sub="bob") as (bob, _):
        async with aioredis.Redis(port=redis.port) as admin:
            await admin.script_load(REMOVE_LUA)  # a cut EVALSHA must be one Redis ran
        await start(alice, script({"tool_calls": [call("read_document")]}, {"say": "x"}),
                    run_id="r-1")
        tool_call = await alice.recv_until("tool.call")
        await bob.send({"type": "run.start", "id": "q", "run_id": "q-1",
                        "prompt": script({"say": "queued"}), "tools": [],
                        "options": {"if_busy": "enqueue"}})
        assert (await bob.recv_until(_reply_to("q")))["status"] == "queued"
        proxy.armed = True
        await bob.send({"type": "run.cancel", "id": "c0", "run_id": "q-1"})
        reply = await bob.recv_until(_reply_to("c0"), timeout=10)
        assert proxy.fired.is_set()
        assert (reply["type"], reply["code"]) == ("error", "unavailable"), reply
        assert reply["retry_after_ms"] > 0
        for attempt in range(1, 30):  # his retries, as told
            await asyncio.sleep(reply["retry_after_ms"] / 1000)
            await bob.send({"type": "run.cancel", "id": f"c{attempt}", "run_id": "q-1"})
            reply = await bob.recv_until(_reply_to(f"c{attempt}"), timeout=10)
            if reply.get("code") != "unavailable":
                break
        assert reply.get("code") == "run_not_active" or reply.get("status") == "cancelled", \
            reply
        ended = await bob.recv_until(_ended("q-1"), timeout=10)  # was never logged
        assert (ended["status"], ended["reason"]) == ("cancelled", "user_cancelled")
        await alice.send({"type": "tool.result", "run_id": "r-1", "call_id": tool_call["call_id"],
                          "token": tool_call["token"], "output": {"text": "doc"}})
        await alice.recv_until(_ended("r-1"), timeout=10)
        await _freed(redis.port, "doc-1")
        await asyncio.sleep(1.0)  # the queue's kick after r-1: q-1 must not start
        logged = await _log(redis.port)
        assert [e["type"] for e in logged if e.get("run_id") == "q-1"] == \
            ["run.queued", "run.finished"]
        assert len(of_run(bob.events, "q-1", "run.finished")) == 1
        async with aioredis.Redis(port=redis.port) as admin:
            record = orjson.loads(await admin.hget("cw:{doc-1}:runs", "q-1") or b"{}")
        assert record.get("status") == "cancelled", record


@pytest.mark.parametrize("outage_s", [2.5, 5.0], ids=["own_retry", "edit"])
async def test_held_text_of_a_run_taken_over_is_not_logged_late(outage_s: float) -> None:
    """The owner's append of held text fails as Redis goes out of its reach for longer
    than the lease: the text was kept to be tried first at the session's next flush.
    Another instance takes the run over (discarding that message) and ends it. When the
    old owner reaches Redis again, that flush came from its own retry of the run's end
    (`own_retry`: it still retries when Redis is back), or from a person's edit there
    (`edit`: it gave up first): the held text was logged into the new owner's story,
    after the message was discarded and the run finished."""
    prompt = script({"say": "abcdZZMKefghijklmnop"}, chunk_chars=4,
                    delay_ms=300).replace("ZZMK", "ZZ\\u004dK")
    async with redis_process() as redis, \
            OutageProxy(redis.port, b"ZZMK", outage_s=outage_s, forward=False) as proxy, \
            running_server(redis_url=proxy.url, run_lease_s=1.0) as stalled, \
            running_server(redis_url=redis.url, run_lease_s=1.0) as survivor, \
            joined(survivor, sub="bob", client_id="watch") as (bob, _), \
            joined(stalled) as (alice, _):
        await start(alice, prompt, run_id="r-1", tools=[])
        await bob.recv_until("message.delta", timeout=10)
        proxy.armed = True
        await asyncio.wait_for(proxy.fired.wait(), 10)
        resumed = await bob.recv_until("run.resumed", timeout=15)
        assert resumed["reason"] == "owner_lost", resumed
        await bob.recv_until(_ended("r-1"), timeout=15)
        await asyncio.sleep(proxy.back_at - time.monotonic() + 1.5)  # Redis is back
        await alice.send({"type": "editor.change", "id": "e", "document_version": 2,
                          "origin": "user"})
        await alice.recv_until(_reply_to("e"), timeout=15)
        await bob.recv_until("document.changed", timeout=15)
        await alice.recv_until("document.changed", timeout=15)
        logged = await _log(redis.port)
    assert [e["seq"] for e in bob.events if "seq" in e] == [e["seq"] for e in logged]
    kinds = [(e["type"], e.get("message_id")) for e in logged]
    discarded = kinds.index(("message.discarded", "r-1:m1"))
    assert ("message.delta", "r-1:m1") not in kinds[discarded:], kinds  # was there
    finished = kinds.index(("run.finished", None))
    assert kinds[finished + 1:] == [("document.changed", None)], kinds
    for client in (alice, bob):
        texts = [e["delta"] for e in of_run(client.events, "r-1", "message.delta")
                 if e["message_id"] == "r-1:m1.r1"]
        done = [e for e in of_run(client.events, "r-1", "message.done")]
        assert len(done) == 1 and "".join(texts) == done[0]["text"]
