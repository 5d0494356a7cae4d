"""Issue "agent runs" benchmarks: abort latency (editor.change sent ->
run.finished received) with 1 and N concurrent streaming runs, and the tool
round trip beside a bare WebSocket ping-pong in the same run."""

import asyncio
import random
import time

import orjson
from websockets.asyncio.client import ClientConnection, connect

from bench.common import (
    Proc,
    Served,
    cowrite_join,
    percentile,
    result_frame,
    script_prompt,
    server_process,
    start_tool_run,
)

LONG_STREAM = script_prompt("lorem ipsum " * 2000, chunk_chars=8, delay_ms=5)
# When, after the first delta, the edit lands (uniform, seconds): anywhere in the first
# 40 deltas of the stream. Short enough that `make bench` affords 200 aborts per server,
# which a p99 needs (of 40, it was the slowest one).
ABORT_DELAY_S = (0.02, 0.2)


async def _until(ws: ClientConnection, kind: str) -> dict[str, object]:
    """The next event of type `kind`. A frame that does not even contain the quoted
    type is skipped unparsed: 200 streams send this client tens of thousands of
    deltas a second, and parsing each made the client, not the server, the
    slowest part of an abort."""
    quoted = f'"{kind}"'
    while True:
        raw = await ws.recv()
        if quoted not in raw:
            continue
        event: dict[str, object] = orjson.loads(raw)
        if event.get("type") == kind:
            return event


async def _one_abort(ws: ClientConnection, delay: float) -> float:
    await ws.send(orjson.dumps({"type": "run.start", "prompt": LONG_STREAM}).decode())
    await _until(ws, "message.delta")
    await asyncio.sleep(delay)
    t0 = time.perf_counter()
    await ws.send('{"type":"editor.change"}')
    await _until(ws, "run.finished")
    return (time.perf_counter() - t0) * 1000


async def abort_latency(proc: Proc, concurrent: int, rounds: int) -> list[float]:
    joined = await asyncio.gather(*(cowrite_join(proc, f"abort-{i}", f"c{i}")
                                    for i in range(concurrent)))
    sockets = [ws for ws, _ in joined]
    latencies: list[float] = []
    rng = random.Random(7)
    try:
        for _ in range(rounds):
            latencies += await asyncio.gather(*(_one_abort(ws, rng.uniform(*ABORT_DELAY_S))
                                                for ws in sockets))
    finally:
        await asyncio.gather(*(ws.close() for ws in sockets))
    return latencies


async def _answer_calls(ws: ClientConnection, count: int | None) -> list[float]:
    """Answer every `tool.call` at once and time `tool.result` sent -> next `tool.call`,
    until `run.finished` (or `count` round trips, for a server that never ends)."""
    trips: list[float] = []
    sent_at = None
    while count is None or len(trips) < count:
        event = orjson.loads(await ws.recv())
        if event["type"] == "tool.call":
            now = time.perf_counter()
            if sent_at is not None:
                trips.append((now - sent_at) * 1000)
            await ws.send(result_frame(event))
            sent_at = time.perf_counter()
        elif event["type"] == "run.finished":
            break
    return trips


async def tool_round_trips(proc: Served, calls: int, document_id: str = "tools"
                           ) -> list[float]:
    async with await start_tool_run(proc, document_id, calls) as ws:
        return await _answer_calls(ws, None)


async def bare_tool_round_trips(proc: Proc, count: int) -> list[float]:
    """The bare app's `/tool`: a `tool.result` answered with cowrite's three frames
    (tool.done, ack, tool.call), timed like `tool_round_trips` (result sent -> call)."""
    async with connect(proc.url("/tool"), compression=None) as ws:
        await ws.send('{"type":"tool.result","call_id":"call_0","output":{"text":"doc"}}')
        return await _answer_calls(ws, count)


async def ping_pongs(proc: Proc, count: int) -> list[float]:
    async with connect(proc.url("/echo"), compression=None) as ws:
        trips = []
        for _ in range(count):
            t0 = time.perf_counter()
            await ws.send('{"type":"tool.result","output":{"text":"doc"}}')
            await ws.recv()
            trips.append((time.perf_counter() - t0) * 1000)
        return trips


async def sse_post_round_trips(proc: Proc, calls: int) -> list[float]:
    """POST a result -> the next tool call arrives on the SSE stream."""
    import httpx

    trips: list[float] = []
    async with httpx.AsyncClient(base_url=proc.url("", "http"), timeout=30) as http, \
            http.stream("GET", "/events", params={"session": "s"}) as stream:
        lines = stream.aiter_lines()
        sent_at = None
        async for line in lines:
            if not line.startswith("data: "):
                continue
            now = time.perf_counter()
            call = orjson.loads(line[6:])["call"]
            if sent_at is not None:
                trips.append((now - sent_at) * 1000)
            if call >= calls:
                return trips
            sent_at = time.perf_counter()
            await http.post("/result", content=orjson.dumps({"session": "s", "call": call}))
    return trips


async def measure(concurrent: int = 200, calls: int = 300) -> dict[str, float]:
    async with server_process("cowrite") as cowrite:
        single = await abort_latency(cowrite, 1, 200)
        many = await abort_latency(cowrite, concurrent, 1)
        tools = await tool_round_trips(cowrite, calls)
    async with server_process("bare") as bare:
        pongs = await ping_pongs(bare, calls)
    async with server_process("sse") as sse:
        sse_trips = await sse_post_round_trips(sse, calls)
    return {
        "abort_1_p50_ms": percentile(single, 50), "abort_1_p99_ms": percentile(single, 99),
        f"abort_{concurrent}_p50_ms": percentile(many, 50),
        f"abort_{concurrent}_p99_ms": percentile(many, 99),
        "tool_rtt_p50_ms": percentile(tools, 50), "tool_rtt_p99_ms": percentile(tools, 99),
        "pingpong_p50_ms": percentile(pongs, 50), "pingpong_p99_ms": percentile(pongs, 99),
        "tool_rtt_ratio_p50": percentile(tools, 50) / percentile(pongs, 50),
        "sse_rtt_p50_ms": percentile(sse_trips, 50), "sse_rtt_p99_ms": percentile(sse_trips, 99),
        "sse_speedup_p50": percentile(sse_trips, 50) / percentile(tools, 50),
    }
