"""Several cowrite instances (real `python -m server` subprocesses) on one real
redis-server, and the client helpers the multi-instance tests share."""

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from bench.common import Proc, server_process
from tests.harness import SECRET, Client, token, ws_client
from tests.redis_support import RedisProcess, redis_process
from tests.runs import EDITOR_TOOLS

# A lapsed lease is noticed within a quarter of it: takeovers in about a second.
FAST_LEASE = {"COWRITE_RUN_LEASE_S": "1"}


@contextlib.asynccontextmanager
async def instance(redis: RedisProcess, env: dict[str, str] | None = None
                   ) -> AsyncIterator[Proc]:
    """One cowrite process on `redis`; stopped with SIGTERM (a drain) on the way out."""
    async with server_process("cowrite", COWRITE_REDIS_URL=redis.url,
                              COWRITE_JWT_SECRET=SECRET, **(env or {})) as proc:
        yield proc


@contextlib.asynccontextmanager
async def cluster(count: int = 2, env: dict[str, str] | None = None
                  ) -> AsyncIterator[tuple[RedisProcess, list[Proc]]]:
    async with redis_process() as redis, contextlib.AsyncExitStack() as stack:
        instances = [await stack.enter_async_context(instance(redis, env))
                     for _ in range(count)]
        yield redis, instances


async def killed(proc: Proc) -> None:
    """kill -9: no drain, no goodbye, no final checkpoint."""
    proc.process.kill()
    await proc.process.wait()


def hello(client_id: str, sub: str, resume: dict[str, Any] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"type": "hello", "protocol": 1, "client_id": client_id,
                               "token": token(sub)}
    if resume:
        message["resume"] = resume
    return message


@contextlib.asynccontextmanager
async def join(proc: Proc, document_id: str = "doc-1", sub: str = "alice",
               client_id: str = "tab", resume: dict[str, Any] | None = None
               ) -> AsyncIterator[tuple[Client, dict[str, Any]]]:
    async with ws_client(proc.url(f"/v1/documents/{document_id}/ws")) as client:
        await client.send(hello(client_id, sub, resume))
        welcome = await client.recv()
        assert welcome["type"] == "welcome", welcome
        yield client, welcome


async def seqs(client: Client, until: int) -> list[int]:
    got: list[int] = []
    while not got or got[-1] < until:
        event = await client.recv_until(lambda e: "seq" in e)
        got.append(event["seq"])
    return got


async def start_run(client: Client, prompt: str, run_id: str,
                    tools: list[dict[str, Any]] | None = None) -> None:
    await client.send({"type": "run.start", "id": "s", "run_id": run_id, "prompt": prompt,
                       "tools": EDITOR_TOOLS if tools is None else tools})
    ack = await client.recv_until(lambda e: e.get("reply_to") == "s")
    assert ack["type"] == "ack", ack


def last_seq(client: Client, welcome: dict[str, Any]) -> int:
    """The last seq this connection saw (what a client resumes after)."""
    return int(max([welcome["last_seq"], *(e["seq"] for e in client.events if "seq" in e)]))


def ended(run_id: str) -> Any:
    return lambda e: e.get("type") == "run.finished" and e.get("run_id") == run_id


def edits_around_scope(count: int, scope_start: int) -> list[tuple[int, int, int]]:
    """`count` edits (from, to, insert), alternately 10 units inserted at 0 and the unit
    just before a scope starting at `scope_start` deleted, each in the coordinates the
    edits before left: none touches the scope, but an insert applied after the delete
    that follows it deletes a unit of the scope (the run aborts); other swaps, and an
    edit lost or applied twice, leave the scope elsewhere."""
    changes, start = [], scope_start
    for i in range(count):
        if i % 2 == 0:
            changes.append((0, 0, 10))
            start += 10
        else:
            changes.append((start - 1, start, 0))
            start -= 1
    return changes


def scope_after(edits: list[tuple[int, int, int]], scope: tuple[int, int]
                ) -> list[dict[str, int]]:
    """Where `edits` (in order, none touching it) leave `scope`."""
    shift = sum(insert - (to - start) for start, to, insert in edits)
    return [{"from": scope[0] + shift, "to": scope[1] + shift}]

