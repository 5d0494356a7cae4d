"""Issue 16 item 6: what OpenTelemetry tracing costs the server, in CPU.

Three servers run side by side for the whole measurement: tracing off
(`COWRITE_OTEL=0`), tracing on with the no-op exporter (`COWRITE_OTEL=1
COWRITE_OTEL_EXPORTER=none`: every span is recorded, ended, made into a
`ReadableSpan` and exported by the same exporting thread a real exporter
gets, to an exporter that drops it), and
tracing off in a process where the otel extra (`opentelemetry.sdk`) cannot
be imported at all. Repetitions alternate between them (the machine is
shared and noisy: only same-invocation ratios mean anything) and each
figure is the median over repetitions.

- tool round trip: one run of `calls` client tool calls (`tool.result` sent
  -> next `tool.call`) on each server at once, the servers' round trips taking
  turns one by one (`taking_turns`); each server's CPU over its run
  divided by its round trips (a round trip is one `cowrite.tool` span, one
  `cowrite.model_call` span and the decisions around them). Taking turns trip
  by trip puts the machine's slow spells on every server alike: with whole runs
  back to back, two identical servers read up to 6% apart;
- text stream: one run of `chars` characters in 2-character deltas, server
  CPU divided by the deltas produced (deltas never pass the tracing hook; the
  row shows that it stays so).

Server CPU is the sum over the server's threads of `/proc/<pid>/task/*/
schedstat` (nanoseconds; the exporting thread is counted), so
a few hundred round trips are enough; `Proc.cpu_s` (clock ticks) is the
fallback where schedstat is missing.

The machine these run on is shared: CPU time per round trip moves by 10-30%
between runs and the paired ratios by a few percent even with 25 pairs.
`python -m bench.tracing --callgrind` counts the servers' instructions per
round trip under valgrind instead (about a minute per server; the counts do
not depend on the load, yet identical servers differ by ~2%).

`python -m bench.tracing` runs it alone and prints the rows (as does `python
-m bench.run --tracing`); `make bench` adds the rows to README's table.
"""

import asyncio
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench import runs
from bench.common import (
    BENCH_SECRET,
    CLIENT_CORE,
    Proc,
    answer_call,
    cowrite_join,
    free_port,
    next_of_type,
    pin,
    script_prompt,
    server_process,
    start_tool_run,
)

VARIANTS = ("off", "on", "no_sdk")
ENV: dict[str, dict[str, str]] = {
    "off": {"COWRITE_OTEL": "0"},
    "on": {"COWRITE_OTEL": "1", "COWRITE_OTEL_EXPORTER": "none"},
    "no_sdk": {"COWRITE_OTEL": "0"},
}
# Put first on PYTHONPATH of the "no_sdk" server: `import opentelemetry.sdk` fails there
# (opentelemetry-api itself stays: the mcp package depends on it).
NO_SDK = "import sys\nsys.modules['opentelemetry.sdk'] = None  # type: ignore[assignment]\n"


def cpu_ns(proc: Proc) -> int:
    """CPU time of all the server's live threads, in ns (clock ticks where schedstat
    is missing). Threads do not exit during a measurement, so differences are exact."""
    total = 0
    try:
        for task in Path(f"/proc/{proc.process.pid}/task").iterdir():
            with contextlib.suppress(FileNotFoundError):
                total += int((task / "schedstat").read_text().split()[0])
    except OSError:
        return int(proc.cpu_s() * 1e9)
    return total


async def text_stream(proc: Proc, chars: int) -> int:
    """Deltas produced by a run of `chars` characters in 2-character deltas, after
    checking the text arrived whole."""
    ws, _ = await cowrite_join(proc, "trace-text", "reader")
    async with ws:
        await ws.send(orjson.dumps({"type": "run.start", "prompt": script_prompt(
            "t" * chars, 2)}).decode())
        parts = []
        while True:
            raw = await ws.recv()
            if '"message.delta"' in raw:
                parts.append(orjson.loads(raw)["delta"])
            elif '"run.finished"' in raw:
                break
    if "".join(parts) != "t" * chars:
        raise RuntimeError("the text stream arrived incomplete")
    return chars // 2


async def _cpu_us(proc: Proc, work: Any, *args: Any) -> float:
    """Server CPU in us per unit of `work` (which returns its unit count)."""
    before = cpu_ns(proc)
    units: int = await work(proc, *args)
    return (cpu_ns(proc) - before) / 1000 / units


async def _round_trips(proc: Proc, calls: int) -> int:
    trips = await runs.tool_round_trips(proc, calls)
    return len(trips) + 1  # the first tool.call has no round trip before it, the last has


async def taking_turns(procs: dict[str, Proc], calls: int, tag: str
                       ) -> tuple[dict[str, float], dict[str, list[float]]]:
    """One run of `calls` client tool calls on each server, their round trips taking
    turns, every answer sent only once the previous server's next call came back:
    each server's CPU (us) per round trip and its round trips (ms). The order
    rotates every turn (A B C, B C A, C A B): every round trip follows another
    server's, and each server takes each place as often. Reversing it instead (A B
    C, C B A) let the first and last server follow themselves every other turn,
    caches still warm, and never the middle one: tracing off against the server
    without the SDK, identical code, read 1.01-1.03x that way, 1.00-1.01x rotated."""
    sockets = {name: await start_tool_run(proc, f"{tag}-{calls}", calls)
               for name, proc in procs.items()}
    try:
        calls_now = {name: await next_of_type(ws, "tool.call") for name, ws in sockets.items()}
        trips: dict[str, list[float]] = {name: [] for name in procs}
        before = {name: cpu_ns(proc) for name, proc in procs.items()}
        names = list(procs)
        for turn in range(calls - 1):
            shift = turn % len(names)
            for name in names[shift:] + names[:shift]:
                started = time.perf_counter()
                calls_now[name] = await answer_call(sockets[name], calls_now[name])
                trips[name].append((time.perf_counter() - started) * 1000)
        spent = {name: (cpu_ns(procs[name]) - before[name]) / 1000 / (calls - 1)
                 for name in names}
        for name, ws in sockets.items():  # the last answer ends each run
            await answer_call(ws, calls_now[name], until="run.finished")
        return spent, trips
    finally:
        for ws in sockets.values():
            await ws.close()


def _write_no_sdk(directory: str) -> None:
    Path(directory, "sitecustomize.py").write_text(NO_SDK)


@contextlib.asynccontextmanager
async def servers() -> AsyncIterator[dict[str, Proc]]:
    with tempfile.TemporaryDirectory(prefix="cowrite-no-otel-") as directory:
        _write_no_sdk(directory)
        async with server_process("cowrite", **ENV["off"]) as off, \
                server_process("cowrite", **ENV["on"]) as on, \
                server_process("cowrite", PYTHONPATH=directory, **ENV["no_sdk"]) as no_sdk:
            yield {"off": off, "on": on, "no_sdk": no_sdk}


async def measure(quick: bool = False) -> dict[str, Any]:
    rounds, reps, calls, chars = (1, 4, 60, 10_000) if quick else (6, 5, 200, 40_000)
    tool: dict[str, list[float]] = {v: [] for v in VARIANTS}
    text: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for _ in range(rounds):  # fresh servers each round: a process's own luck (hash seed,
        async with servers() as procs:  # memory layout) is worth a few percent
            for proc in procs.values():  # warm-up: imports, first spans, caches
                await _cpu_us(proc, _round_trips, 20)
                await _cpu_us(proc, text_stream, 2_000)
            for rep in range(reps):
                order = VARIANTS if rep % 2 == 0 else VARIANTS[::-1]
                spent, _ = await taking_turns({v: procs[v] for v in order}, calls,
                                            "trace-tools")
                for variant in VARIANTS:
                    tool[variant].append(spent[variant])
                for variant in order:
                    text[variant].append(await _cpu_us(procs[variant], text_stream, chars))
    out: dict[str, Any] = {"reps": rounds * reps, "calls": calls, "chars": chars,
                           "rounds": rounds, "tool_all": tool, "text_all": text}
    for variant in VARIANTS:
        out[f"tool_{variant}_us"] = statistics.median(tool[variant])
        out[f"text_{variant}_us"] = statistics.median(text[variant])
    # Ratios within a repetition (the servers measured back to back), then their median:
    # the load other work puts on the machine drifts between repetitions, not within.
    out["tool_on_ratio"] = _paired(tool["on"], tool["off"])
    out["tool_off_ratio"] = _paired(tool["off"], tool["no_sdk"])
    out["text_on_ratio"] = _paired(text["on"], text["off"])
    out["hook_off_ns"] = 2 * hook_off_ns()
    return out


def hook_off_ns() -> float:
    """ns per decision of the driver's hook when tracing is off: `if tracing.active is not
    None` on the real module (`server.agent.driver`), timed here (best of 5)."""
    from server import tracing as module

    assert module.active is None
    n = 1_000_000
    best = min(timeit.repeat("if tracing.active is not None: pass", number=n, repeat=5,
                             globals={"tracing": module}))
    empty = min(timeit.repeat("pass", number=n, repeat=5))
    return max(0.0, best - empty) / n * 1e9


def _paired(a: list[float], b: list[float]) -> float:
    return statistics.median(x / y for x, y in zip(a, b, strict=True))


def rows(m: dict[str, Any]) -> list[tuple[str, str, str, str, str, bool]]:
    """Rows for README's issue table: (figure, cowrite, bare, ratio, goal, met); the
    "bare" column holds the baseline server of each row."""
    on, off, text_on = m["tool_on_ratio"], m["tool_off_ratio"], m["text_on_ratio"]
    return [
        ("tracing overhead: server CPU per client tool round trip, tracing on with a no-op "
         f"exporter (bare column: off; medians of {m['reps']} runs of {m['calls']} round "
         "trips, the servers' round trips taking turns one by one, on "
         f"{m['rounds']} set{'s' * (m['rounds'] != 1)} of servers; ratio: the median of "
         "the runs' paired ratios)",
         f"{m['tool_on_us']:.0f} us", f"{m['tool_off_us']:.0f} us", f"{on:.3f}x",
         "<= 1.05x", on <= 1.05),
        ("tracing off: server CPU per client tool round trip (bare column: a server where "
         "the otel extra, `opentelemetry.sdk`, cannot be imported; the driver's hook, "
         f"one attribute test per decision, costs {m['hook_off_ns']:.0f} ns of the round "
         "trip's two decisions)",
         f"{m['tool_off_us']:.0f} us", f"{m['tool_no_sdk_us']:.0f} us", f"{off:.3f}x",
         "zero when off (<= 1.03x: noise)", off <= 1.03),
        (f"tracing overhead: server CPU per delta of a text stream ({m['chars']:,} chars in "
         "2-char deltas), on with a no-op exporter (bare column: off)",
         f"{m['text_on_us']:.2f} us", f"{m['text_off_us']:.2f} us", f"{text_on:.3f}x",
         "<= 1.05x", text_on <= 1.05),
    ]


def table_rows(m: dict[str, Any]) -> str:
    """The rows as lines of README's issue table (same six columns)."""
    return "\n".join(f"| {a} | {b} | {c} | {d} | {e} | {'yes' if ok else 'NO'} |"
                     for a, b, c, d, e, ok in rows(m))


def text(m: dict[str, Any]) -> str:
    head = "| figure | cowrite | baseline | ratio | goal | met |\n|---|---|---|---|---|---|\n"
    spread = "\n".join(f"  {v}: " + " ".join(f"{x:.0f}" for x in m["tool_all"][v])
                       for v in VARIANTS)
    return head + table_rows(m) + f"\n\nus of server CPU per tool round trip, by run:\n{spread}"


@contextlib.asynccontextmanager
async def callgrind_server(variant: str, directory: str) -> AsyncIterator[tuple[Proc, str]]:
    """A cowrite server under `valgrind --tool=callgrind`, instrumentation off until
    `counted` switches it on; yields the server and its output file pattern."""
    port = free_port()
    out = f"{directory}/cg.{variant}"
    env = {**os.environ, "COWRITE_PORT": str(port), "COWRITE_JWT_SECRET": BENCH_SECRET,
           "COWRITE_LOG_LEVEL": "warning", "COWRITE_RATE_MESSAGES_PER_S": "0",
           "COWRITE_RATE_RUNS_PER_MIN": "0", "COWRITE_MAX_STEPS": "100000",
           "COWRITE_HANDSHAKE_TIMEOUT_S": "120", "COWRITE_HELLO_TIMEOUT_S": "120",
           **ENV[variant]}
    if variant == "no_sdk":
        env["PYTHONPATH"] = directory
    process = await asyncio.create_subprocess_exec(
        "valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
        sys.executable, "-m", "server", env=env, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    proc = Proc(process, port)
    try:
        async with httpx.AsyncClient() as http:
            for _ in range(3000):
                with contextlib.suppress(httpx.HTTPError):
                    if (await http.get(proc.url("/healthz", "http"), timeout=60)).status_code \
                            == 200:
                        break
                await asyncio.sleep(0.1)
            else:
                raise RuntimeError("the server under callgrind did not start")
        yield proc, out
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGINT)
        await process.wait()


async def _control(pid: int, *args: str) -> None:
    done = await asyncio.create_subprocess_exec(
        "callgrind_control", *args, str(pid), stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    await done.wait()


def _clear(out: str) -> None:
    for path in Path(out).parent.glob(Path(out).name + ".*"):
        path.unlink()


def _instructions(out: str) -> int:
    total = 0
    for path in Path(out).parent.glob(Path(out).name + ".*"):
        for line in path.read_text().splitlines():
            if line.startswith(("summary:", "totals:")):
                total += int(line.split()[1])
                break
    return total


async def _counted(proc: Proc, out: str, work: Any, *args: Any) -> float:
    """Server instructions per unit of `work`, all threads (callgrind: deterministic,
    whatever else the machine runs)."""
    _clear(out)
    await _control(proc.process.pid, "-z")
    await _control(proc.process.pid, "-i", "on")
    units: int = await work(proc, *args)
    await _control(proc.process.pid, "-d")
    await _control(proc.process.pid, "-i", "off")
    return _instructions(out) / units


async def measure_callgrind(quick: bool = False) -> dict[str, Any]:
    """Instructions per tool round trip for the three servers, one after the other (about
    a minute each). Instructions do not depend on what else the machine runs; they still
    differ by ~2% between identical servers (timers and event-loop wake-ups follow wall
    time, which valgrind stretches). Deltas
    are not measured this way: under callgrind the server is so slow that deltas merge
    differently from one run to the next."""
    calls = 30 if quick else 200
    out: dict[str, Any] = {"calls": calls}
    with tempfile.TemporaryDirectory(prefix="cowrite-trace-cg-") as directory:
        _write_no_sdk(directory)
        for variant in VARIANTS:
            async with callgrind_server(variant, directory) as (proc, cg):
                await _round_trips(proc, 10)  # warm-up
                out[f"tool_{variant}_ki"] = await _counted(proc, cg, _round_trips, calls) / 1000
    return out


def callgrind_text(m: dict[str, Any]) -> str:
    on, off, bare = (m[f"tool_{v}_ki"] for v in VARIANTS)
    return (f"server instructions per tool round trip ({m['calls']} round trips, callgrind): "
            f"off {off:,.0f} k, on (no-op exporter) {on:,.0f} k, otel extra not importable "
            f"{bare:,.0f} k; on/off {on / off:.3f}x, off/not importable {off / bare:.3f}x")


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer and smaller repetitions")
    parser.add_argument("--callgrind", action="store_true",
                        help="instructions under callgrind instead of CPU time (minutes)")
    args = parser.parse_args()
    if args.callgrind:
        print(callgrind_text(asyncio.run(measure_callgrind(args.quick))))
        return
    pin(0, CLIENT_CORE)
    print(text(asyncio.run(measure(args.quick))))


if __name__ == "__main__":
    main()
