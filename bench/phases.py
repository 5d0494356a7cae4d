"""Where a client tool round trip's time goes inside the server: `python -m bench.phases`.

Starts the server with timestamps around the steps of a round trip (this
module again, with `PHASES_OUT` set: `python -m server` with a wrapper around
a few of its functions, about a microsecond each), pinned as `make bench`
pins it, answers `--calls` tool calls `--reps` times, and prints the median
time of each step after the read of the `tool.result` (the server's own
clock), for the most common sequence of steps, beside the client's p50. A
profile in a loop reads each step warm; this reads it where it runs, between
two idle waits of the event loop. A diagnosis, not a figure of record: it
names server functions, so renaming one fails here loudly.
"""

import argparse
import asyncio
import collections
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from bench import runs
from bench.common import CLIENT_CORE, pin, server_process

Marks = list[tuple[str, int]]


def _steps() -> list[tuple[object, str, str, bool]]:
    """(owner, attribute, label, also mark the return): the steps timed."""
    from server import endpoint, session, wsprotocol
    from server.agent import coordinator, driver, machine

    return [
        (wsprotocol.LeanSansIOProtocol, "send_text_now", "write", True),
        (endpoint, "admit", "parse and check", True),
        (coordinator.RunCoordinator, "handle", "to the run", False),
        (machine.RunMachine, "decide", "decision", True),
        (session.DocumentSession, "publish_many", "publish", False),
        (driver.RunDriver, "_remember", "history", False),
        (driver.RunDriver, "_start_model_eagerly", "model turn", True),
    ]


def serve() -> None:
    """The server, each read of a client's frame starting a new list of marks."""
    from server import wsprotocol
    from server.__main__ import main

    clock = time.perf_counter_ns
    trips: list[Marks] = []
    current: list[Marks] = []

    def timed(function: Callable[..., Any], label: str, after: bool) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if current:
                current[0].append((label, clock()))
            result = function(*args, **kwargs)
            if after and current:
                current[0].append((label + " done", clock()))
            return result
        return wrapper

    for owner, name, label, after in _steps():
        setattr(owner, name, timed(getattr(owner, name), label, after))
    protocol = wsprotocol.LeanSansIOProtocol
    read = protocol.data_received

    def data_received(self: wsprotocol.LeanSansIOProtocol, data: bytes) -> None:
        marks: Marks = [("read", clock())]
        trips.append(marks)
        current[:] = [marks]
        read(self, data)
        marks.append(("read done", clock()))

    def dump(_signal: int, _frame: object) -> None:
        path = os.environ["PHASES_OUT"]
        with open(path + ".part", "w") as out:
            json.dump(trips, out)
        os.replace(path + ".part", path)  # whole, or not there yet

    protocol.data_received = data_received  # type: ignore[method-assign]
    signal.signal(signal.SIGUSR1, dump)
    sys.argv = ["server"]
    raise SystemExit(main())


def _marks(path: str) -> list[Marks] | None:
    try:
        with open(path) as f:
            marks: list[Marks] = json.load(f)
    except FileNotFoundError:
        return None
    return marks


async def measure(calls: int, reps: int) -> tuple[float, list[tuple[str, float]], int, int]:
    """(client p50 us, [(step, median us after the read)], trips of that shape, trips)."""
    with tempfile.TemporaryDirectory(prefix="cowrite-phases-") as directory:
        out = os.path.join(directory, "marks.json")
        async with server_process("phases", PHASES_OUT=out) as proc:
            await runs.tool_round_trips(proc, 100, "warm")
            client: list[float] = []
            for rep in range(reps):
                client += await runs.tool_round_trips(proc, calls, f"phases-{rep}")
            proc.process.send_signal(signal.SIGUSR1)
            trips = None
            for _ in range(200):
                await asyncio.sleep(0.05)
                trips = _marks(out)
                if trips is not None:
                    break
            if trips is None:
                raise RuntimeError("the server wrote no marks")
    trips = trips[-calls * reps:]
    shapes = collections.Counter(tuple(label for label, _ in marks) for marks in trips)
    shape, count = shapes.most_common(1)[0]
    same = [marks for marks in trips if tuple(label for label, _ in marks) == shape]
    steps = [(label, statistics.median((marks[i][1] - marks[0][1]) / 1000 for marks in same))
             for i, label in enumerate(shape)]
    return statistics.median(client) * 1000, steps, count, len(trips)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--reps", type=int, default=5)
    if os.environ.get("PHASES_OUT"):  # started by `measure` as the server
        serve()
        return
    args = parser.parse_args()
    pin(0, CLIENT_CORE)
    p50, steps, count, total = asyncio.run(measure(args.calls, args.reps))
    print(f"client round trip p50 {p50:.0f} us; server steps, median us after the read "
          f"({count} of {total} round trips took this sequence):")
    previous = 0.0
    for label, at in steps:
        print(f"  {at:7.1f}  (+{at - previous:5.1f})  {label}")
        previous = at


if __name__ == "__main__":
    main()
