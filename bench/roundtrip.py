"""The client tool round trip alone, for work on it: `python -m bench.roundtrip`.

Prints the p50 of cowrite's round trip (`tool.result` sent -> next `tool.call`)
beside the bare app's echo and its three-frame answer, measured alternately in
one invocation (servers pinned as `make bench` pins them; the median of the
repetitions' p50s). `--callgrind` instead counts the server's instructions per
round trip under valgrind (`bench.tracing`'s harness, tracing off): slower, but
the count does not depend on what else the machine runs. Neither writes README;
`make bench`'s row stays the figure of record.
"""

import argparse
import asyncio
import shutil
import statistics
import tempfile
from pathlib import Path

from bench import runs, tracing
from bench.common import CLIENT_CORE, percentile, pin, server_process


async def p50s(calls: int, reps: int) -> dict[str, float]:
    """Median over `reps` of each server's p50 (us). Both servers run side by side and
    take turns, the order reversed every repetition: a shared machine's slow spells
    (seen here: the same server 270 us in one minute, 420 us the next) then fall on
    both columns alike instead of on whichever happened to run then."""
    got: dict[str, list[float]] = {"cowrite": [], "echo": [], "three_frames": []}
    async with server_process("cowrite") as cowrite, server_process("bare") as bare:
        await runs.tool_round_trips(cowrite, 100, "warm")
        await runs.ping_pongs(bare, 100)
        for rep in range(reps):
            order = ["cowrite", "echo", "three_frames"]
            for name in order if rep % 2 == 0 else order[::-1]:
                if name == "cowrite":
                    trips = await runs.tool_round_trips(cowrite, calls, f"trips-{rep}")
                elif name == "echo":
                    trips = await runs.ping_pongs(bare, calls)
                else:
                    trips = await runs.bare_tool_round_trips(bare, calls)
                got[name].append(percentile(trips, 50) * 1000)
    return {name: statistics.median(values) for name, values in got.items()}


async def instructions(calls: int, keep: str | None = None) -> float:
    """Server instructions per round trip; with `keep`, callgrind's out files are copied
    into that directory (for `callgrind_annotate`, per function)."""
    with tempfile.TemporaryDirectory(prefix="cowrite-rtt-cg-") as directory:
        async with tracing.callgrind_server("off", directory) as (proc, out):
            await tracing._round_trips(proc, 20)  # warm-up
            count = await tracing._counted(proc, out, tracing._round_trips, calls)
        if keep is not None:
            _copy_out_files(directory, keep)
        return count


def _copy_out_files(directory: str, keep: str) -> None:
    Path(keep).mkdir(parents=True, exist_ok=True)
    for path in Path(directory).glob("cg.*"):
        shutil.copy(path, Path(keep) / path.name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--callgrind", action="store_true")
    parser.add_argument("--keep", metavar="DIR",
                        help="with --callgrind: copy callgrind's out files into DIR")
    args = parser.parse_args()
    if args.callgrind:
        count = asyncio.run(instructions(min(args.calls, 200), args.keep))
        print(f"server instructions per client tool round trip: {count / 1000:,.0f} k")
        return
    pin(0, CLIENT_CORE)
    m = asyncio.run(p50s(args.calls, args.reps))
    print(f"tool round trip p50: cowrite {m['cowrite']:.0f} us, bare echo {m['echo']:.0f} us "
          f"({m['cowrite'] / m['echo']:.2f}x), bare three frames {m['three_frames']:.0f} us")


if __name__ == "__main__":
    main()
