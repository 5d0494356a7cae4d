"""Two checkouts' tool round trips side by side, trip by trip: `python -m bench.ab OTHER`.

For deciding whether a change to the round trip is worth keeping. `OTHER` is
another checkout of cowrite (e.g. `git worktree add /tmp/base HEAD~1`), run
with this checkout's Python and packages; this checkout is B. Both servers
run at once, pinned to one core, and their round trips take turns one by
one, so the machine's slow spells, which move whole runs by 10-40% here,
fall on both alike. Each repetition is one run of
`--calls` client tool calls per server; printed: the median over repetitions
of B's p50 and CPU per round trip divided by A's, and their range.

Taking turns leaves each server's caches colder than a run of its own does,
so the absolute figures are higher than `make bench`'s: read the ratios only.
Two servers of the same checkout differ by up to ~2% this way (a process's
own luck: hash seed, memory layout); a smaller difference is no difference.
"""

import argparse
import asyncio
import contextlib
import statistics
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

from bench.common import (
    CLIENT_CORE,
    SERVER_CORE,
    Proc,
    free_port,
    percentile,
    pin,
    server_env,
    wait_ready,
)
from bench.tracing import taking_turns

HERE = Path(__file__).resolve().parent.parent


@contextlib.asynccontextmanager
async def checkout_server(tree: Path, **extra: str) -> AsyncIterator[Proc]:
    """`python -m server` of the checkout `tree` (its code first on the path)."""
    port = free_port()
    env = {**server_env(port, **extra), "PYTHONPATH": str(tree)}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "server", env=env, cwd=tree, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    pin(process.pid, SERVER_CORE)
    proc = Proc(process, port)
    try:
        await wait_ready(proc)
        yield proc
    finally:
        process.terminate()
        await process.wait()


async def paired_run(servers: dict[str, Proc], calls: int, tag: str
                     ) -> tuple[dict[str, float], dict[str, float]]:
    """One run per server, round trips taking turns (`bench.tracing.taking_turns`):
    each server's p50 (us) and server CPU per round trip (us)."""
    cpu, trips = await taking_turns(servers, calls, f"ab-{tag}")
    return {name: percentile(trips[name], 50) * 1000 for name in servers}, cpu


async def compare(other: Path, calls: int, reps: int, env: dict[str, str]) -> str:
    async with checkout_server(other, **env) as a, checkout_server(HERE, **env) as b:
        servers = {"A": a, "B": b}
        await paired_run(servers, 100, "warm")
        p50_ratios, cpu_ratios = [], []
        for rep in range(reps):
            p50, cpu = await paired_run(servers, calls, str(rep))
            p50_ratios.append(p50["B"] / p50["A"])
            cpu_ratios.append(cpu["B"] / cpu["A"])
    return (f"B ({HERE}) / A ({other}), {reps} runs of {calls} round trips:\n"
            f"  p50 {statistics.median(p50_ratios):.3f}x "
            f"({min(p50_ratios):.3f}-{max(p50_ratios):.3f})\n"
            f"  server CPU per round trip {statistics.median(cpu_ratios):.3f}x "
            f"({min(cpu_ratios):.3f}-{max(cpu_ratios):.3f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("other", type=Path, help="the other checkout (A)")
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="a setting for both servers, e.g. COWRITE_OTEL=1 (repeatable)")
    args = parser.parse_args()
    env = dict(item.partition("=")[::2] for item in args.env)
    if not (args.other / "server" / "__main__.py").is_file():
        parser.error(f"{args.other} is not a cowrite checkout (no server/__main__.py)")
    pin(0, CLIENT_CORE)
    print(asyncio.run(compare(args.other.resolve(), args.calls, args.reps, env)))


if __name__ == "__main__":
    main()
