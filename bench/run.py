"""`make bench` / `python -m bench.run`: measure issue 16's figures (`bench.issue`),
cowrite beside the bare app in one invocation, and issue 12's durable-run rows
(`bench.durable`: takeover time, checkpoint cost), print the table and rewrite
README's benchmark table (between the bench markers). `--durable` measures and
prints only issue 12's rows. `--extended` adds the older suites (Redis, SSE, load
scenarios, memory at the edges), a few minutes more."""

import argparse
import asyncio
import os
import platform
import resource
import time
from pathlib import Path
from typing import Any

import orjson

from bench import durable, edges, issue, runs, scale, scenarios, tracing, transport
from bench.common import CLIENT_CORE, pin

README = Path(__file__).resolve().parent.parent / "README.md"
START, END = "<!-- bench:start -->", "<!-- bench:end -->"
EXT_START, EXT_END = "<!-- bench-extended:start -->", "<!-- bench-extended:end -->"
pinned = False
idle_only = False
durable_only = False
tracing_only = False


def table(t: dict[str, float], r: dict[str, float], s: dict[str, float], concurrent: int) -> str:
    rows = [
        ("events/s delivered to one connection", f"{t['cowrite_events_per_s']:,.0f}",
         f"{t['bare_events_per_s']:,.0f}",
         f"{t['cowrite_events_per_s'] / t['bare_events_per_s']:.2f}x", ""),
        ("server CPU per delivered event", f"{t['cowrite_cpu_us_per_event']:.1f} us",
         f"{t['bare_cpu_us_per_event']:.1f} us", f"{t['cpu_ratio']:.2f}x", "<= 2x"),
        ("memory per idle connection (1,000)", f"{t['cowrite_kib_per_idle_connection']:.1f} KiB",
         f"{t['bare_kib_per_idle_connection']:.1f} KiB",
         f"{t['cowrite_kib_per_idle_connection'] / t['bare_kib_per_idle_connection']:.2f}x",
         "<= 40 KiB"),
        ("abort latency p50 / p99, 1 run", f"{r['abort_1_p50_ms']:.2f} / "
         f"{r['abort_1_p99_ms']:.2f} ms", "", "", "p99 <= 2 ms"),
        (f"abort latency p50 / p99, {concurrent} runs",
         f"{r[f'abort_{concurrent}_p50_ms']:.2f} / {r[f'abort_{concurrent}_p99_ms']:.2f} ms",
         "", "", "p99 <= 20 ms"),
        ("tool round trip p50 / p99 (vs ping-pong)", f"{r['tool_rtt_p50_ms']:.2f} / "
         f"{r['tool_rtt_p99_ms']:.2f} ms", f"{r['pingpong_p50_ms']:.2f} / "
         f"{r['pingpong_p99_ms']:.2f} ms", f"{r['tool_rtt_ratio_p50']:.2f}x", "p50 <= 2x"),
        ("tool round trip p50 / p99 (vs SSE + POST)", f"{r['tool_rtt_p50_ms']:.2f} / "
         f"{r['tool_rtt_p99_ms']:.2f} ms", f"{r['sse_rtt_p50_ms']:.2f} / "
         f"{r['sse_rtt_p99_ms']:.2f} ms", f"{r['sse_speedup_p50']:.2f}x faster",
         ">= 4x faster"),
    ]
    lines = ["| measure | cowrite | baseline | ratio | goal |", "|---|---|---|---|---|"]
    lines += [f"| {' | '.join(row)} |" for row in rows]
    lines += [
        f"| delta delivery across instances, added p50 / p99 | {s['cross_p50_ms']:.2f} / "
        f"{s['cross_p99_ms']:.2f} ms | {s['same_p50_ms']:.2f} / {s['same_p99_ms']:.2f} ms "
        "(same instance) | | < 1 ms added at p50 |",
        f"| deltas/s to one connection, Redis backend | {s['redis_deltas_per_s']:,.0f} "
        f"({s['redis_events']:,.0f} events) | {s['memory_deltas_per_s']:,.0f} "
        f"({s['memory_events']:,.0f} events, memory) | "
        f"{s['redis_deltas_per_s'] / s['memory_deltas_per_s']:.2f}x | |",
        f"| server CPU per delta, Redis backend | {s['redis_cpu_us_per_delta']:.1f} us | "
        f"{s['memory_cpu_us_per_delta']:.1f} us (memory) | "
        f"{s['redis_cpu_us_per_delta'] / s['memory_cpu_us_per_delta']:.2f}x | |",
    ]
    lines.append("")
    lines.append(
        f"Measured {time.strftime('%Y-%m-%d')} with `make bench` on {platform.machine()}, "
        f"Python {platform.python_version()}; client and servers on one 2-core machine. "
        f"{t['deltas_produced']:,.0f} deltas were produced and "
        f"{t['events_delivered']:,.0f} events delivered (average frame "
        f"{t['cowrite_avg_frame_bytes']:.0f} B; deltas merge while the reader is backed up); "
        f"the bare endpoint sent the same number of frames of the same size. Baselines: the "
        f"bare Starlette app (first rows), a bare WebSocket echo (tool round trip), two "
        f"clients of one instance (cross-instance row), the memory backend (Redis rows).")
    return "\n".join(lines)


def rewrite_readme(text: str, start: str = START, end: str = END) -> None:
    readme = README.read_text()
    head, _, rest = readme.partition(start)
    _, _, tail = rest.partition(end)
    README.write_text(f"{head}{start}\n{text}\n{end}{tail}")


def issue_text(m: dict[str, Any]) -> str:
    return issue.table(m, durable.rows(m["durable"])) + "\n" + tracing.table_rows(
        m["tracing"]) + (
        f"\n\nMeasured {time.strftime('%Y-%m-%d')} with `make bench` (`python -m bench.run`) "
        f"on {platform.machine()}, Python {platform.python_version()}, "
        f"{os.cpu_count()} cores shared with other work; servers pinned to core 0 and the "
        f"client to core 1 ({'pinned' if m['pinned'] else 'pinning unavailable'}). Both "
        "columns come from the same invocation.")


async def main_async(quick: bool, write: bool, extended: bool) -> None:
    if idle_only:
        print(issue.idle_row(await issue.measure_idle(quick)))
        return
    if durable_only:
        found = await durable.measure(quick)
        print(orjson.dumps(found, option=orjson.OPT_INDENT_2).decode())
        print(issue.render(durable.rows(found)))
        return
    if tracing_only:
        print(tracing.text(await tracing.measure(quick)))
        return
    m = await issue.measure(quick)
    m["durable"] = await durable.measure(quick)
    m["tracing"] = await tracing.measure(quick)
    m["pinned"] = pinned
    text = issue_text(m)
    print(text)
    if write:
        rewrite_readme(text)
        print(f"\nrewrote the benchmark table in {README}")
    if extended:
        await extended_async(quick, write)


async def extended_async(quick: bool, write: bool) -> None:
    concurrent = 50 if quick else 200
    t = await transport.measure(deltas=3000 if quick else 20_000,
                                connections=200 if quick else 1000)
    r = await runs.measure(concurrent=concurrent, calls=50 if quick else 300)
    s = await scale.measure(deltas=300 if quick else 2000)
    text = table(t, r, s, concurrent)
    loads = await scenarios.run_all(quick)
    text += ("\n\nLoad scenarios (`python -m bench.load`; JSON and Markdown reports in "
             "bench/results/):\n\n" + scenarios.table(loads, t["bare_cpu_us_per_event"]))
    print(text)
    edges_text = edges.table(await edges.measure(quick))
    print("\n" + edges_text)
    if write:
        rewrite_readme(text, EXT_START, EXT_END)
        edges.rewrite_readme(edges_text)
        print(f"\nrewrote the extended benchmark tables in {README}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller runs, for a smoke test")
    parser.add_argument("--no-readme", action="store_true", help="print only")
    parser.add_argument("--extended", action="store_true",
                        help="also the older suites: Redis, SSE, load scenarios, memory edges")
    parser.add_argument("--idle-memory", action="store_true",
                        help="only the idle-memory row (cowrite and bare), printed")
    parser.add_argument("--durable", action="store_true",
                        help="only issue 12's rows (takeover time, checkpoint cost), printed")
    parser.add_argument("--tracing", action="store_true",
                        help="only the tracing-overhead rows (bench.tracing), printed")
    args = parser.parse_args()
    global pinned, idle_only, durable_only, tracing_only
    idle_only, durable_only, tracing_only = args.idle_memory, args.durable, args.tracing
    pinned = pin(0, CLIENT_CORE)
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    asyncio.run(main_async(args.quick, write=not args.no_readme and not args.quick,
                           extended=args.extended))


if __name__ == "__main__":
    main()
