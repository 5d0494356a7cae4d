"""Issue 16's figures, cowrite beside the bare Starlette/uvicorn app in one invocation.

Every row is measured in the same run against both servers (the machine is
shared and noisy, so only same-run ratios mean anything); servers are pinned
to core 0 and this client to core 1 where the OS allows (`bench.common.pin`).

- tool round trip: `tool.result` sent -> next `tool.call` received (p50),
  beside a bare WebSocket echo; both servers up at once and taking turns, the
  median of 9 runs' p50s (`bench.roundtrip`);
- text throughput: 200,000 characters in 2-character deltas to one reader,
  beside the bare app sending the same 100,000 delta frames;
- idle memory: server RSS per connection, 1,000 connections after `welcome`;
- abort: `editor.change` sent -> `run.finished` received (p99), one run alone
  and 200 runs streaming, beside the bare app stopping a stream;
- first delta p99 with 1,000 concurrent scripted runs (`bench.load`, verified:
  lost or duplicated events are counted);
- cold start: `run.start` -> first delta of the first run after the server
  started, through an OpenAI-compatible upstream (`bench.upstream`), beside
  the later runs of the same server;
- edit-aware runs (issue 13, `bench.editbench`): abort latency of an edit
  inside the scope in `overlap` mode beside the default `abort` mode, and
  server CPU per edit outside the scope while 200 runs stream;
- idle delivery: a slow stream (one delta every 5 ms) to an idle reader must
  arrive one frame per delta: merging never holds a delta back on an idle
  connection (a bench check, not a test).
"""

import asyncio
import statistics
import time
from dataclasses import dataclass
from typing import Any

import orjson
from websockets.asyncio.client import ClientConnection, connect

from bench import editbench, load, roundtrip, runs, scenarios, transport
from bench.common import Proc, Served, cowrite_join, percentile, script_prompt, server_process

CHARS = 200_000


@dataclass(frozen=True)
class Sizes:
    chars: int
    calls: int
    abort_rounds: int
    concurrent_aborts: int
    idle_connections: int
    load_docs: int
    cold_starts: int
    trip_reps: int  # alternating runs of `calls` round trips per server
    text_reps: int  # alternating runs of `chars` characters per server

    @staticmethod
    def of(quick: bool) -> "Sizes":
        if quick:
            return Sizes(20_000, 50, 20, 50, 200, 100, 1, 3, 3)
        return Sizes(CHARS, 300, 200, 200, 1000, 1000, 3, 9, 5)


async def _bare_one_abort(ws: ClientConnection, delay: float) -> float:
    await ws.send('{"type":"run.start"}')
    while '"message.delta"' not in await ws.recv():
        pass
    await asyncio.sleep(delay)
    t0 = time.perf_counter()
    await ws.send('{"type":"editor.change"}')
    while '"run.finished"' not in await ws.recv():
        pass
    return (time.perf_counter() - t0) * 1000


async def bare_aborts(proc: Proc, concurrent: int, rounds: int) -> list[float]:
    import random

    sockets = await asyncio.gather(*(connect(proc.url("/abortable"), compression=None)
                                     for _ in range(concurrent)))
    rng, latencies = random.Random(7), []
    try:
        for _ in range(rounds):
            latencies += await asyncio.gather(*(
                _bare_one_abort(ws, rng.uniform(*runs.ABORT_DELAY_S)) for ws in sockets))
    finally:
        await asyncio.gather(*(ws.close() for ws in sockets))
    return latencies


async def bare_text(proc: Proc, chars: int) -> float:
    """Seconds for the bare app to send `chars` characters as 2-character deltas."""
    frames = chars // 2
    async with connect(proc.url("/stream"), compression=None, max_size=None) as ws:
        t0 = time.perf_counter()
        await ws.send(orjson.dumps({"n": frames, "delta": "xx"}).decode())
        for _ in range(frames):
            await ws.recv()
        return time.perf_counter() - t0


async def cowrite_text(proc: Served, chars: int, document_id: str = "bench-text"
                       ) -> tuple[float, int, str]:
    """Seconds for cowrite to deliver a run of `chars` characters in 2-character
    deltas, the frames it took, and the text as received (checked by the caller)."""
    ws, _ = await cowrite_join(proc, document_id, "reader")
    async with ws:
        t0 = time.perf_counter()
        await ws.send(orjson.dumps({"type": "run.start", "prompt": script_prompt(
            "y" * chars, 2)}).decode())
        frames, parts = 0, []
        while True:
            raw = await ws.recv()
            frames += 1
            if '"message.delta"' in raw:
                parts.append(orjson.loads(raw)["delta"])
            elif '"run.finished"' in raw:
                break
        return time.perf_counter() - t0, frames, "".join(parts)


async def text_rates(chars: int, reps: int) -> dict[str, Any]:
    """Text throughput of cowrite and of the bare app, side by side: `reps` runs each,
    taking turns (the order reversed every run), the median of each server's chars/s.
    One run of each, minutes apart, read 1.02x to 1.42x on the same code: the
    machine's slow spells fell on whichever server ran then."""
    rates: dict[str, list[float]] = {"cowrite": [], "bare": []}
    frames: list[int] = []
    intact = True
    async with server_process("cowrite") as cowrite, server_process("bare") as bare:
        await cowrite_text(cowrite, chars // 10, "bench-text-warm")  # imports, first run
        await bare_text(bare, chars // 10)
        for rep in range(reps):
            order = ["cowrite", "bare"] if rep % 2 == 0 else ["bare", "cowrite"]
            for name in order:
                if name == "cowrite":
                    seconds, count, text = await cowrite_text(cowrite, chars, f"bench-text-{rep}")
                    intact = intact and text == "y" * chars
                    frames.append(count)
                else:
                    seconds = await bare_text(bare, chars)
                rates[name].append(chars / seconds)
    return {"text_ok": intact, "text_reps": reps,
            "cowrite_chars_per_s": statistics.median(rates["cowrite"]),
            "bare_chars_per_s": statistics.median(rates["bare"]),
            "cowrite_text_frames": int(statistics.median(frames))}


async def slow_stream_frames(proc: Proc, deltas: int = 40) -> tuple[int, int]:
    """A 5 ms-paced stream of 1-character deltas to one idle reader: (delta frames
    received, deltas produced). Equal counts mean no delta was held back for merging."""
    ws, _ = await cowrite_join(proc, "bench-idle-delivery", "reader")
    async with ws:
        await ws.send(orjson.dumps({"type": "run.start", "prompt": script_prompt(
            "z" * deltas, 1, delay_ms=5)}).decode())
        frames = 0
        while True:
            raw = await ws.recv()
            if '"message.delta"' in raw:
                frames += 1
            elif '"run.finished"' in raw:
                return frames, deltas


async def first_deltas(proc: Proc, runs_: int) -> list[float]:
    """ms from `run.start` to the first delta, for `runs_` runs in a row."""
    ws, _ = await cowrite_join(proc, "bench-cold", "reader")
    found = []
    async with ws:
        for _ in range(runs_):
            t0 = time.perf_counter()
            await ws.send('{"type":"run.start","prompt":"hello","mode":"chat"}')
            first = None
            while True:
                raw = await ws.recv()
                if first is None and '"message.delta"' in raw:
                    first = (time.perf_counter() - t0) * 1000
                elif '"run.finished"' in raw:
                    break
            found.append(first if first is not None else float("nan"))
    return found


async def cold_start(starts: int) -> tuple[list[float], list[float]]:
    import httpx

    cold, warm = [], []
    async with server_process("upstream") as upstream:
        async with httpx.AsyncClient() as http:  # the upstream's own cold start is not ours
            for _ in range(3):
                await http.post(upstream.url("/v1/chat/completions", "http"),
                                json={"model": "m", "messages": [], "stream": True})
        env = {"COWRITE_LLM": "openai", "COWRITE_OPENAI_API_KEY": "bench-key",
               "COWRITE_OPENAI_BASE_URL": upstream.url("/v1", "http")}
        for _ in range(starts):
            async with server_process("cowrite", **env) as cowrite:
                times = await first_deltas(cowrite, 11)
            cold.append(times[0])
            warm += times[1:]
    return cold, warm


async def measure(quick: bool = False) -> dict[str, Any]:
    size = Sizes.of(quick)
    out: dict[str, Any] = {"sizes": size.__dict__}
    out.update(await text_rates(size.chars, size.text_reps))
    async with server_process("cowrite") as cowrite:
        single = await runs.abort_latency(cowrite, 1, size.abort_rounds)
        many = await runs.abort_latency(cowrite, size.concurrent_aborts, 1)
        out["cowrite_abort_idle_p99_ms"] = percentile(single, 99)
        out["cowrite_abort_busy_p99_ms"] = percentile(many, 99)
        out["idle_frames"], out["idle_deltas"] = await slow_stream_frames(cowrite)
    async with server_process("cowrite") as cowrite:
        out["cowrite_idle_kib"] = await transport.idle_memory(
            cowrite, size.idle_connections, cowrite=True) / 1024
    async with server_process("bare") as bare:
        out["bare_abort_idle_p99_ms"] = percentile(
            await bare_aborts(bare, 1, size.abort_rounds), 99)
        out["bare_abort_busy_p99_ms"] = percentile(
            await bare_aborts(bare, size.concurrent_aborts, 1), 99)
    async with server_process("bare") as bare:
        out["bare_idle_kib"] = await transport.idle_memory(
            bare, size.idle_connections, cowrite=False) / 1024
    trips = await roundtrip.p50s(size.calls, size.trip_reps)  # both servers, taking turns
    out["cowrite_tool_p50_ms"], out["bare_tool_p50_ms"], out["bare_three_frames_p50_ms"] = (
        trips["cowrite"] / 1000, trips["echo"] / 1000, trips["three_frames"] / 1000)
    scenario = load.Scenario(name=f"runs-{size.load_docs}", docs=size.load_docs, deltas=200,
                             tools=3, delay_ms=20, ramp_s=2.0, run_timeout_s=120)
    report = await scenarios.run_apart(scenario)  # a generator process of its own
    errors = report["verification_errors"]
    out["load_first_delta_p99_ms"] = report["first_delta_ms"].get("p99", float("nan"))
    out["load_lost_duplicated"] = errors.get("seq_gap", 0) + errors.get("duplicate_event", 0)
    out["load_verification"] = "ok" if not errors else errors
    out["load_runs"] = sum(report["runs_finished"].values())
    cold, warm = await cold_start(size.cold_starts)
    out["cold_first_ms"], out["warm_first_ms"] = cold, statistics.median(warm)
    out["edits"] = await editbench.measure(quick)
    return out


async def measure_idle(quick: bool = False) -> dict[str, Any]:
    """Only the idle-memory row (`python -m bench.run --idle-memory`): the same
    measurement as in `measure`, for iterating on per-connection memory."""
    size = Sizes.of(quick)
    async with server_process("cowrite") as cowrite:
        cowrite_kib = await transport.idle_memory(cowrite, size.idle_connections,
                                                  cowrite=True) / 1024
    async with server_process("bare") as bare:
        bare_kib = await transport.idle_memory(bare, size.idle_connections, cowrite=False) / 1024
    return {"sizes": size.__dict__, "cowrite_idle_kib": cowrite_kib, "bare_idle_kib": bare_kib}


def idle_row(m: dict[str, Any]) -> str:
    return (f"idle memory per connection ({m['sizes']['idle_connections']:,} connections after "
            f"welcome): cowrite {m['cowrite_idle_kib']:.1f} KiB, bare {m['bare_idle_kib']:.1f} "
            f"KiB, {_ratio(m['cowrite_idle_kib'], m['bare_idle_kib'])}, goal <= 32 KiB")


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else ""


Row = tuple[str, str, str, str, str, bool]  # figure, cowrite, bare, ratio, goal, met


def render(rows: "list[Row]") -> str:
    lines = ["| figure | cowrite | bare | ratio | goal | met |", "|---|---|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c} | {d} | {e} | {'yes' if ok else 'NO'} |"
              for a, b, c, d, e, ok in rows]
    return "\n".join(lines)


def table(m: dict[str, Any], extra: "list[Row] | None" = None) -> str:
    """Issue 16's rows (and issue 13's), then `extra` (issue 12's, `bench.durable`)."""
    size = m["sizes"]
    cold = m["cold_first_ms"]
    cold_text = (f"{min(cold):.1f}-{max(cold):.1f} ms" if len(cold) > 1 else f"{cold[0]:.1f} ms")
    penalty = max(cold) - m["warm_first_ms"]
    rows: list[Row] = [
        ("client tool round trip p50 (tool.result -> next tool.call; median of "
         f"{size.get('trip_reps', 1)} runs of {size['calls']} round trips, the servers side by "
         "side taking turns); bare column: an echo "
         "(the issue's baseline); the bare app answering with cowrite's three frames "
         f"(tool.done, ack, tool.call): {m['bare_three_frames_p50_ms'] * 1000:.0f} us",
         f"{m['cowrite_tool_p50_ms'] * 1000:.0f} us", f"{m['bare_tool_p50_ms'] * 1000:.0f} us",
         _ratio(m["cowrite_tool_p50_ms"], m["bare_tool_p50_ms"]), "<= 2x bare",
         m["cowrite_tool_p50_ms"] <= 2 * m["bare_tool_p50_ms"]),
        (f"text throughput, {size['chars']:,} chars in 2-char deltas to one client "
         f"({m['cowrite_text_frames']:,} frames; median of {m['text_reps']} runs, the servers "
         "side by side taking turns)",
         f"{m['cowrite_chars_per_s']:,.0f} chars/s", f"{m['bare_chars_per_s']:,.0f} chars/s",
         _ratio(m["cowrite_chars_per_s"], m["bare_chars_per_s"]), ">= 1x bare",
         m["cowrite_chars_per_s"] >= m["bare_chars_per_s"] and m["text_ok"]),
        (f"idle memory per connection ({size['idle_connections']:,} connections after welcome)",
         f"{m['cowrite_idle_kib']:.1f} KiB", f"{m['bare_idle_kib']:.1f} KiB",
         _ratio(m["cowrite_idle_kib"], m["bare_idle_kib"]), "<= 32 KiB",
         m["cowrite_idle_kib"] <= 32),
        (f"abort p99 (editor.change -> run.finished), idle ({size['abort_rounds']} aborts) / "
         f"{size['concurrent_aborts']} runs streaming",
         f"{m['cowrite_abort_idle_p99_ms']:.1f} / {m['cowrite_abort_busy_p99_ms']:.1f} ms",
         f"{m['bare_abort_idle_p99_ms']:.1f} / {m['bare_abort_busy_p99_ms']:.1f} ms", "",
         "<= 2 / 20 ms",
         m["cowrite_abort_idle_p99_ms"] <= 2 and m["cowrite_abort_busy_p99_ms"] <= 20),
        *editbench.rows(m["edits"]),
        (f"first delta p99 with {size['load_docs']:,} concurrent runs "
         f"(lost or duplicated events: {m['load_lost_duplicated']})",
         f"{m['load_first_delta_p99_ms']:.1f} ms", "-", "", "<= 100 ms, 0 lost",
         m["load_first_delta_p99_ms"] <= 100 and m["load_verification"] == "ok"),
        ("first run after start through an OpenAI-compatible upstream, to first delta "
         "(bare column: later runs)", cold_text, f"{m['warm_first_ms']:.1f} ms",
         f"{penalty:+.1f} ms", "no cold-start penalty (<= +5 ms)", penalty <= 5),
        ("idle connection, 5 ms-paced stream: deltas sent alone (none held back to merge)",
         f"{m['idle_frames']} of {m['idle_deltas']}", "", "", "all",
         m["idle_frames"] == m["idle_deltas"]),
    ]
    return render(rows + (extra or []))
