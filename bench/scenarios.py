"""The standard load scenarios `make bench` runs (issue "load-testing scripts")."""

import asyncio
import subprocess
import sys
from dataclasses import asdict, fields
from typing import Any

import orjson

from bench.load import RESULTS, Scenario


def cli_args(scenario: Scenario) -> list[str]:
    """`python -m bench.load` flags for `scenario`."""
    args: list[str] = []
    for field in fields(scenario):
        value = asdict(scenario)[field.name]
        flag = "--" + field.name.replace("_", "-")
        if isinstance(value, bool):
            args += [flag] if value else []
        else:
            args += [flag, str(value)]
    return args


async def run_apart(scenario: Scenario, redis: bool = False) -> dict[str, Any]:
    """Run `scenario` with `python -m bench.load --spawn` in a process of its own
    (pinned to the client core, on uvloop, its collector off) and return its
    report: inside `make bench`'s process the generator shared a loop and a heap
    with everything measured before, and at 1,000 connections the generator's
    own lag was part of what it measured."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.load", "--spawn", "--no-progress",
        *(["--redis"] if redis else []), *cli_args(scenario),
        stdout=subprocess.DEVNULL)
    await process.wait()  # exit 1 means verification failed: the report says so
    report: dict[str, Any] = orjson.loads((RESULTS / f"{scenario.name}.json").read_bytes())
    return report


def standard(quick: bool) -> list[tuple[Scenario, bool]]:
    """(scenario, on two Redis-backed instances?)"""
    scale = 10 if quick else 1
    return [
        (Scenario(name="runs-1000", docs=1000 // scale, deltas=200, tools=3, delay_ms=20,
                  ramp_s=2.0, run_timeout_s=120), False),
        (Scenario(name="fanout-100", docs=1, collaborators=100 // scale, deltas=200, tools=3,
                  approvals=1, delay_ms=10), False),
        (Scenario(name="idle-10000", docs=1000 // scale, collaborators=10, idle=True,
                  ramp_s=5.0 / scale), False),
        (Scenario(name="abort-200", docs=200 // scale, deltas=200, tools=3, delay_ms=10,
                  edit_rate=0.2, ramp_s=1.0), False),
        (Scenario(name="redis-2-instances", docs=200 // scale, collaborators=2, deltas=200,
                  tools=3, delay_ms=10, edit_rate=0.1, drop_rate=0.1, ramp_s=1.0), True),
    ]


async def run_all(quick: bool) -> list[dict[str, Any]]:
    return [await run_apart(scenario, redis) for scenario, redis in standard(quick)]


def table(reports: list[dict[str, Any]], bare_cpu_us: float) -> str:
    lines = ["| scenario | connections | runs/s | events/s | first delta p99 | abort p99 | "
             f"CPU/event (bare: {bare_cpu_us:.1f} us) | lost / duplicated | verification |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in reports:
        errors = r["verification_errors"]
        lost_dup = errors.get("seq_gap", 0) + errors.get("duplicate_event", 0)
        first = r["first_delta_ms"].get("p99")
        abort = r["abort_ms"].get("p99")
        cpu = r.get("server_cpu_us_per_event")
        extra = ""
        if "idle_kib_per_connection" in r:
            extra = f" ({r['idle_kib_per_connection']:.1f} KiB per idle connection)"
        lines.append(
            f"| {r['scenario']['name']}{extra} | {r['connections']:,} | {r['runs_per_s']:.1f} | "
            f"{r['events_per_s']:,.0f} | {'' if first is None else f'{first:.1f} ms'} | "
            f"{'' if abort is None else f'{abort:.1f} ms'} | "
            f"{'' if cpu is None else f'{cpu:.1f} us ({cpu / bare_cpu_us:.1f}x)'} | "
            f"{lost_dup} | {'ok' if not errors else errors} |")
    return "\n".join(lines)
