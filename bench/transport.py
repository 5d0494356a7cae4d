"""Issue "transport core" benchmarks: delivery throughput and CPU per event,
and memory per idle connection, each beside the bare Starlette endpoint."""

import asyncio
import time
from dataclasses import dataclass

import orjson
from websockets.asyncio.client import connect

from bench.common import Proc, cowrite_join, script_prompt, server_process


@dataclass
class Throughput:
    events: int
    seconds: float
    cpu_s: float
    avg_bytes: float

    @property
    def per_s(self) -> float:
        return self.events / self.seconds

    @property
    def cpu_us_per_event(self) -> float:
        return self.cpu_s / self.events * 1e6


async def cowrite_stream(proc: Proc, deltas: int, chunk: int) -> tuple[Throughput, int]:
    """One connection receives a scripted run of `deltas` chunks; returns the
    delivery figures and how many deltas the model produced."""
    ws, _ = await cowrite_join(proc, "bench-stream", "reader")
    async with ws:
        text = "x" * (deltas * chunk)
        cpu0, t0 = proc.cpu_s(), time.perf_counter()
        await ws.send(orjson.dumps({"type": "run.start", "prompt":
                                    script_prompt(text, chunk)}).decode())
        events, size = 0, 0
        while True:
            raw = await ws.recv()
            events += 1
            size += len(raw)
            if '"run.finished"' in raw:
                break
        seconds, cpu = time.perf_counter() - t0, proc.cpu_s() - cpu0
    return Throughput(events, seconds, cpu, size / events), deltas


async def bare_stream(proc: Proc, frames: int, size: int) -> Throughput:
    async with connect(proc.url("/stream"), compression=None, max_size=None) as ws:
        cpu0, t0 = proc.cpu_s(), time.perf_counter()
        await ws.send(orjson.dumps({"n": frames, "size": size}).decode())
        received = 0
        for _ in range(frames):
            received += len(await ws.recv())
        return Throughput(frames, time.perf_counter() - t0, proc.cpu_s() - cpu0,
                          received / frames)


async def idle_memory(proc: Proc, count: int, cowrite: bool) -> float:
    """Bytes of server RSS per idle connection (after hello/welcome for cowrite)."""
    await asyncio.sleep(0.3)
    before = proc.rss_bytes()
    sockets = []
    for start in range(0, count, 100):
        batch = range(start, min(count, start + 100))
        if cowrite:
            joined = await asyncio.gather(*(cowrite_join(proc, f"idle-{i % 50}", f"c{i}")
                                            for i in batch))
            sockets += [ws for ws, _ in joined]
        else:
            sockets += await asyncio.gather(*(connect(proc.url("/echo"), compression=None)
                                              for _ in batch))
    await asyncio.sleep(0.5)
    after = proc.rss_bytes()
    await asyncio.gather(*(ws.close() for ws in sockets))
    return (after - before) / count


async def measure(deltas: int = 20_000, connections: int = 1000) -> dict[str, float]:
    async with server_process("cowrite") as cowrite:
        cw, produced = await cowrite_stream(cowrite, deltas, chunk=40)
        cw_memory = await idle_memory(cowrite, connections, cowrite=True)
    async with server_process("bare") as bare:
        bw = await bare_stream(bare, cw.events, round(cw.avg_bytes))
        bare_memory = await idle_memory(bare, connections, cowrite=False)
    return {
        "cowrite_events_per_s": cw.per_s, "bare_events_per_s": bw.per_s,
        "cowrite_cpu_us_per_event": cw.cpu_us_per_event,
        "bare_cpu_us_per_event": bw.cpu_us_per_event,
        "cpu_ratio": cw.cpu_us_per_event / bw.cpu_us_per_event,
        "cowrite_avg_frame_bytes": cw.avg_bytes, "deltas_produced": produced,
        "events_delivered": cw.events,
        "cowrite_kib_per_idle_connection": cw_memory / 1024,
        "bare_kib_per_idle_connection": bare_memory / 1024,
    }
