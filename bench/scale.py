"""Issue "scale out" benchmarks: what Redis adds.

- Cross-instance delivery: a run owned by instance B streams deltas; one
  client reads them on B, another on A. The added latency of a delta is its
  arrival on A minus its arrival on B (same client process, same clock). The
  single-instance figure is the same measure with both clients on B.
- Deltas/s streamed to one connection through the Redis backend against the
  memory backend, same scripted run (Redis merges deltas produced while an
  append is in flight, so it delivers fewer, larger events).
"""

import asyncio
import time

import orjson
from websockets.asyncio.client import ClientConnection

from bench.common import Proc, cowrite_join, percentile, redis_server, script_prompt, server_process
from bench.transport import cowrite_stream


async def _arrivals(ws: ClientConnection, run_done: asyncio.Event) -> dict[int, float]:
    arrivals: dict[int, float] = {}
    while True:
        raw = await ws.recv()
        now = time.perf_counter()
        if '"message.delta"' in raw:
            arrivals[orjson.loads(raw)["seq"]] = now
        elif '"run.finished"' in raw:
            run_done.set()
            return arrivals


async def added_latency(owner: Proc, other: Proc, document_id: str, deltas: int) -> list[float]:
    """Arrival on `other` minus arrival on `owner`, per delta, in ms."""
    starter, _ = await cowrite_join(owner, document_id, "starter")
    near, _ = await cowrite_join(owner, document_id, "near", sub="near")
    far, _ = await cowrite_join(other, document_id, "far", sub="far")
    done = asyncio.Event()
    try:
        tasks = [asyncio.create_task(_arrivals(ws, done)) for ws in (near, far)]
        await starter.send(orjson.dumps({"type": "run.start", "prompt": script_prompt(
            "x" * (deltas * 8), 8, delay_ms=2)}).decode())
        near_at, far_at = await asyncio.gather(*tasks)
    finally:
        for ws in (starter, near, far):
            await ws.close()
    return [(far_at[seq] - near_at[seq]) * 1000 for seq in near_at if seq in far_at]


async def measure(deltas: int = 2000) -> dict[str, float]:
    async with redis_server() as url:
        env = {"COWRITE_REDIS_URL": url}
        async with server_process("cowrite", **env) as a, server_process("cowrite", **env) as b:
            same = await added_latency(b, b, "same-instance", deltas)
            cross = await added_latency(b, a, "cross-instance", deltas)
            redis_tp, produced = await cowrite_stream(a, 20_000, chunk=40)
    async with server_process("cowrite") as memory:
        memory_tp, _ = await cowrite_stream(memory, 20_000, chunk=40)
    return {
        "same_p50_ms": percentile(same, 50), "same_p99_ms": percentile(same, 99),
        "cross_p50_ms": percentile(cross, 50), "cross_p99_ms": percentile(cross, 99),
        "redis_deltas_per_s": produced / redis_tp.seconds,
        "memory_deltas_per_s": produced / memory_tp.seconds,
        "redis_events": redis_tp.events, "memory_events": memory_tp.events,
        "redis_cpu_us_per_delta": redis_tp.cpu_s / produced * 1e6,
        "memory_cpu_us_per_delta": memory_tp.cpu_s / produced * 1e6,
    }
