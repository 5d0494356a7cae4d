"""Issue 11 under load, against server subprocesses whose RSS we read from
/proc: a client that stops reading during a 5 MB stream, 10,000 documents
used once, and a 5 s Redis outage with clients on two instances."""

import asyncio
import contextlib
import re
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import orjson
import pytest
from websockets.asyncio.client import ClientConnection, connect

from bench.common import Proc, server_process
from tests.harness import SECRET, RawClient, token
from tests.redis_support import redis_process

pytestmark = pytest.mark.slow
STREAM_CHARS = 5_000_000


async def metric(proc: Proc, name: str, labels: str = "") -> float:
    async with httpx.AsyncClient() as http:
        text = (await http.get(proc.url("/metrics", "http"))).text
    found = re.search(rf"^{re.escape(name + labels)} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


async def until(check: Callable[[], Awaitable[bool]], timeout: float, what: str) -> None:
    """Poll a server-side condition (a metric) until it holds."""
    for _ in range(int(timeout / 0.1)):
        if await check():
            return
        await asyncio.sleep(0.1)
    assert await check(), what


async def evicted(proc: Proc) -> bool:
    return await metric(proc, "cowrite_memory_documents") == 0


async def join(proc: Proc, document_id: str, sub: str, client_id: str,
               resume: dict[str, Any] | None = None) -> tuple[ClientConnection, dict[str, Any]]:
    ws = await connect(proc.url(f"/v1/documents/{document_id}/ws"), compression=None,
                       max_size=None)
    hello: dict[str, Any] = {"type": "hello", "protocol": 1, "client_id": client_id,
                             "token": token(sub, secret=SECRET)}
    if resume is not None:
        hello["resume"] = resume
    await ws.send(orjson.dumps(hello).decode())
    welcome = orjson.loads(await ws.recv())
    assert welcome["type"] == "welcome", welcome
    return ws, welcome


async def frames_until(ws: ClientConnection, done: Callable[[dict[str, Any]], bool]
                       ) -> list[str]:
    """Raw text of every durable frame until `done` matches one."""
    got: list[str] = []
    async with asyncio.timeout(120):
        while True:
            raw = str(await ws.recv())
            event = orjson.loads(raw)
            if "seq" in event:
                got.append(raw)
            if done(event):
                return got


def big_run() -> str:
    return orjson.dumps({"type": "run.start", "prompt": orjson.dumps({
        "script": [{"say": "x" * STREAM_CHARS}], "chunk_chars": 1000, "delay_ms": 1}).decode()
    }).decode()


async def stream_to_reader(proc: Proc, document_id: str) -> None:
    ws, _ = await join(proc, document_id, "warm", "w")
    await ws.send(big_run())
    await frames_until(ws, lambda e: e.get("type") == "run.finished")
    await ws.close()


async def test_a_client_that_stops_reading_gets_4009_and_its_memory_back() -> None:
    env = {"COWRITE_MAX_MESSAGE_BYTES": str(8 * 1024 * 1024), "COWRITE_CLOSE_TIMEOUT_S": "30",
           "COWRITE_MEMORY_IDLE_S": "1", "COWRITE_JWT_SECRET": SECRET}
    async with server_process("cowrite", **env) as proc:
        for round_ in range(2):  # the same work with a reader only, till the heap settles
            await stream_to_reader(proc, f"warm-up-{round_}")
            await until(lambda: evicted(proc), 30, "warm-up document evicted")
        before = proc.rss_bytes()

        writer, welcome = await join(proc, "doc", "alice", "writer")
        slow = await RawClient.connect(proc.port, "/v1/documents/doc/ws")
        slow.send({"type": "hello", "protocol": 1, "client_id": "slow",
                   "token": token("sam", secret=SECRET)})
        await writer.send(big_run())
        live = await frames_until(writer, lambda e: e.get("type") == "run.finished")
        await until(lambda: _closed_4009(proc), 60, "4009 decided")
        # the slow client reads at last: its frames, then the close frame with 4009
        received: list[bytes] = []
        code = None
        async with asyncio.timeout(60):
            while True:
                opcode, payload = await slow.read_frame()
                if opcode == 0x8:
                    code = int.from_bytes(payload[:2], "big")
                    assert b"slow consumer" in payload[2:]
                    break
                received.append(payload)
        slow.close()
        assert code == 4009
        durable = [p.decode() for p in received if b'"seq":' in p and
                   not p.startswith(b'{"type":"welcome"')]
        first = welcome["last_seq"] + 1
        seqs = [orjson.loads(p)["seq"] for p in durable]
        assert seqs == list(range(first, first + len(seqs)))
        assert durable == live[:len(durable)]  # byte-identical to what the reader got
        last_seq = orjson.loads(live[-1])["seq"]
        resume = {"epoch": welcome["epoch"], "after_seq": seqs[-1] if seqs else first - 1}
        again, w = await join(proc, "doc", "sam", "slow", resume)
        assert w["resumed"] is True
        rest = await frames_until(again, lambda e: e.get("seq") == last_seq)
        assert durable + rest == live  # nothing lost, byte for byte
        for ws in (again, writer):
            await ws.close()
        await until(lambda: evicted(proc), 30, "document evicted once idle")
        after = proc.rss_bytes()
    assert after <= before * 1.2, (before, after)


async def _closed_4009(proc: Proc) -> bool:
    return await metric(proc, "cowrite_closes_total", '{code="4009"}') >= 1


async def test_ten_thousand_documents_used_once_are_evicted_and_rss_falls() -> None:
    env = {"COWRITE_MEMORY_IDLE_S": "3", "COWRITE_JWT_SECRET": SECRET,
           "COWRITE_MAX_CONNECTIONS_PER_USER": "0"}
    async with server_process("cowrite", **env) as proc:
        async def use(name: str) -> None:
            ws, _ = await join(proc, name, "alice", "t")
            await ws.send('{"type":"editor.change","document_version":1}')
            await frames_until(ws, lambda e: e.get("type") == "document.changed")
            await ws.close()

        async def flood(prefix: str, count: int, parallel: int = 32) -> None:
            names = iter(range(count))

            async def worker() -> None:
                for index in names:
                    await use(f"{prefix}-{index}")
            await asyncio.gather(*(worker() for _ in range(parallel)))

        await flood("warm", 300)
        await until(lambda: evicted(proc), 30, "warm-up evicted")
        before = proc.rss_bytes()
        await flood("doc", 10_000)
        peak = proc.rss_bytes()
        await until(lambda: evicted(proc), 60, "every document evicted once idle")
        after = proc.rss_bytes()
    assert after <= before * 1.2, (before, peak, after)


async def test_a_redis_outage_closes_no_connection_on_either_instance() -> None:
    async with redis_process() as redis, contextlib.AsyncExitStack() as stack:
        one, two = [await stack.enter_async_context(server_process(
            "cowrite", COWRITE_REDIS_URL=redis.url, COWRITE_JWT_SECRET=SECRET))
            for _ in range(2)]
        clients = [await join(one, "doc", "alice", "a"), await join(two, "doc", "bob", "b"),
                   await join(two, "doc", "carol", "c")]
        sockets = [ws for ws, _ in clients]
        seen: list[list[int]] = [[] for _ in sockets]
        start_seq = clients[0][1]["last_seq"]

        async def read(index: int) -> None:
            async for raw in sockets[index]:
                event = orjson.loads(raw)
                if "seq" in event:
                    seen[index].append(event["seq"])

        readers = [asyncio.create_task(read(i)) for i in range(len(sockets))]

        async def edit(ws: ClientConnection, version: str) -> None:
            await ws.send(orjson.dumps({"type": "editor.change",
                                        "document_version": version}).decode())

        await edit(sockets[0], "before")
        await redis.stop()
        for ws in sockets:  # during the outage: refused politely, never closed
            await edit(ws, "during")
        await asyncio.sleep(5)  # the outage itself
        await redis.start()
        for round_ in range(50):  # after it: edits succeed again once Redis answers
            for ws in sockets:
                await edit(ws, f"after-{round_}")
            await asyncio.sleep(0.1)
            if all(len(s) >= 4 for s in seen):
                break
        last = max(s[-1] for s in seen)
        for _ in range(400):  # the last events reach every instance's clients
            if all(s and s[-1] >= last for s in seen):
                break
            await asyncio.sleep(0.05)
        for task in readers:
            task.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
        for ws in sockets:
            assert ws.close_code is None  # nobody was closed
        for s in seen:
            assert s == list(range(start_seq + 1, s[-1] + 1))  # gapless on every instance
        for ws in sockets:
            await ws.close()
