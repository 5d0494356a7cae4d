"""Several cowrite instances (subprocesses) sharing one real redis-server."""

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from bench.common import Proc, server_process
from tests.harness import SECRET, Client, token, ws_client
from tests.redis_support import RedisProcess, redis_process

pytestmark = pytest.mark.redis


@contextlib.asynccontextmanager
async def cluster(count: int = 2, env: dict[str, str] | None = None
                  ) -> AsyncIterator[tuple[RedisProcess, list[Proc]]]:
    async with redis_process() as redis, contextlib.AsyncExitStack() as stack:
        instances = [
            await stack.enter_async_context(server_process(
                "cowrite", COWRITE_REDIS_URL=redis.url, COWRITE_JWT_SECRET=SECRET, **(env or {})))
            for _ in range(count)
        ]
        yield redis, instances


@contextlib.asynccontextmanager
async def join(proc: Proc, document_id: str = "doc-1", sub: str = "alice",
               client_id: str = "tab", resume: dict[str, Any] | None = None
               ) -> AsyncIterator[tuple[Client, dict[str, Any]]]:
    async with ws_client(proc.url(f"/v1/documents/{document_id}/ws")) as client:
        hello: dict[str, Any] = {"type": "hello", "protocol": 1, "client_id": client_id,
                                 "token": token(sub)}
        if resume:
            hello["resume"] = resume
        await client.send(hello)
        welcome = await client.recv()
        assert welcome["type"] == "welcome", welcome
        yield client, welcome


async def seqs(client: Client, until: int) -> list[int]:
    got: list[int] = []
    while not got or got[-1] < until:
        event = await client.recv_until(lambda e: "seq" in e)
        got.append(event["seq"])
    return got


async def test_fan_out_across_instances_with_identical_seq() -> None:
    async with cluster() as (_, (one, two)), join(one, client_id="a") as (a, wa), \
            join(two, sub="bob", client_id="b") as (b, wb):
        assert wa["epoch"] == wb["epoch"]
        await asyncio.gather(*(a.send({"type": "editor.change", "document_version": i})
                               for i in range(20)),
                             *(b.send({"type": "editor.change", "document_version": i})
                               for i in range(20)))
        seen_a, seen_b = await seqs(a, 40), await seqs(b, 40)
        assert seen_a == seen_b == list(range(1, 41))


async def test_resume_on_another_instance() -> None:
    async with cluster() as (_, (one, two)), join(two, sub="bob", client_id="w") as (writer, _):
        async with join(one) as (reader, welcome):
            await writer.send({"type": "editor.change"})
            assert await seqs(reader, 1) == [1]
        for _ in range(5):
            await writer.send({"type": "editor.change"})
        await seqs(writer, 6)
        resume = {"epoch": welcome["epoch"], "after_seq": 1}
        async with join(two, resume=resume) as (again, back):
            assert back["resumed"] is True and back["replayed"] == 5
            assert await seqs(again, 6) == [2, 3, 4, 5, 6]


async def test_connection_limit_is_shared() -> None:
    env = {"COWRITE_MAX_CONNECTIONS_PER_USER": "2"}
    async with cluster(env=env) as (_, (one, two)), join(one, client_id="x"), \
            join(two, client_id="y"):
        async with ws_client(one.url("/v1/documents/doc-1/ws")) as third:
            await third.send({"type": "hello", "protocol": 1, "client_id": "z",
                              "token": token()})
            assert await third.expect_close() == 4008


async def test_redis_outage_readyz_clear_errors_and_recovery() -> None:
    async with cluster() as (redis, (one, two)), join(one, client_id="a") as (a, _), \
            join(two, sub="bob", client_id="b") as (b, _):
        await a.send({"type": "editor.change"})
        assert await seqs(b, 1) == [1]
        await redis.stop()
        async with httpx.AsyncClient() as http:
            for _ in range(50):
                if (await http.get(one.url("/readyz", "http"))).status_code == 503:
                    break
                await asyncio.sleep(0.1)
            assert (await http.get(one.url("/readyz", "http"))).status_code == 503
            assert (await http.get(one.url("/healthz", "http"))).status_code == 200
            await a.send({"type": "editor.change", "id": "during"})
            error = await a.recv_until("error", timeout=10)
            assert error["code"] == "unavailable" and error["reply_to"] == "during"
            assert error["retry_after_ms"] > 0
            await redis.start()
            for _ in range(100):
                if (await http.get(one.url("/readyz", "http"))).status_code == 200:
                    break
                await asyncio.sleep(0.1)
        await asyncio.sleep(1.5)  # let pub/sub reconnect
        await a.send({"type": "editor.change", "id": "after"})
        assert await seqs(b, 2) == [2]  # the connection survived; nothing before was lost
        assert (await a.recv_until(lambda e: e.get("seq") == 2))["type"] == "document.changed"
