"""Issue 13's figures: edit-aware runs (PROTOCOL.md section 11) under load.

- abort latency (`editor.change` sent -> `run.finished` received) for a user
  edit inside the run's `context.scope` with `options.on_edit: "overlap"`,
  beside the same edit to a run in the default `abort` mode; rounds of the two
  modes alternate (on two documents), so machine noise hits both alike. Idle,
  then with `busy_runs` runs streaming on other documents;
- server CPU per non-overlapping edit while those runs stream: the server
  process's CPU time over windows of edits outside the scope minus the idle
  rate measured in windows around them (same wall time, no edits), divided by
  the edits sent. The run must survive every edit (0 aborts), announce each as
  `run.scope`, and end with the scope the client computes itself. The same
  windows on a document without a run (only the `document.changed` broadcast)
  give the baseline column.

The background runs stream at an LLM-like pace (8 characters every 50 ms,
~40 tokens/s each), so the server is not saturated: CPU time of a saturated
process tracks wall time and a per-edit difference would mean nothing. The
baseline windows report the server's load so that can be checked.
"""

import asyncio
import contextlib
import random
import statistics
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import orjson
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from bench.common import Proc, cowrite_join, percentile, script_prompt, server_process

SCOPE = (1000, 2000)
INSIDE = {"from": 1500, "to": 1502, "insert": 1}
MEASURED = script_prompt("lorem ipsum " * 2000, chunk_chars=8, delay_ms=5)
BACKGROUND = script_prompt("dolor sit amet " * 100, chunk_chars=8, delay_ms=50)
SLOW = script_prompt("consectetur " * 1500, chunk_chars=8, delay_ms=40)  # ~90 s, cancelled


@dataclass(frozen=True)
class Sizes:
    rounds: int  # abort rounds per mode while other documents stream
    idle_rounds: int  # ... and with nothing else running: 200 make the p99 a p99, not the max
    busy_runs: int
    edits: int  # per CPU window
    windows: int

    @staticmethod
    def of(quick: bool) -> "Sizes":
        return Sizes(10, 10, 50, 300, 2) if quick else Sizes(40, 200, 200, 1000, 4)


def _start(prompt: str, overlap: bool) -> bytes:
    frame: dict[str, Any] = {"type": "run.start", "prompt": prompt,
                             "context": {"scope": [{"from": SCOPE[0], "to": SCOPE[1]}]}}
    if overlap:
        frame["options"] = {"on_edit": "overlap"}
    return orjson.dumps(frame)


async def _until(ws: ClientConnection, kind: str) -> dict[str, Any]:
    while True:
        event: dict[str, Any] = orjson.loads(await ws.recv())
        if event.get("type") == kind:
            return event


async def _one_abort(ws: ClientConnection, overlap: bool, delay: float) -> tuple[float, bool]:
    """ms from an in-scope edit to `run.finished`, and whether it said document_changed."""
    await ws.send(_start(MEASURED, overlap).decode())
    await _until(ws, "message.delta")
    await asyncio.sleep(delay)
    t0 = time.perf_counter()
    await ws.send(orjson.dumps({"type": "editor.change", "changes": [INSIDE]}).decode())
    finished = await _until(ws, "run.finished")
    ms = (time.perf_counter() - t0) * 1000
    return ms, finished.get("status") == "aborted" and finished.get("reason") == "document_changed"


async def abort_rounds(proc: Proc, rounds: int, tag: str) -> dict[str, Any]:
    """Alternating abort/overlap rounds: latencies per mode and rounds not ended by the edit."""
    (abort_ws, _), (overlap_ws, _) = await asyncio.gather(
        cowrite_join(proc, f"edit-abort-{tag}", "a"),
        cowrite_join(proc, f"edit-overlap-{tag}", "o"))
    rng = random.Random(13)
    found: dict[str, list[float]] = {"abort": [], "overlap": []}
    wrong = 0
    async with abort_ws, overlap_ws:
        for _ in range(rounds):
            for mode, ws in (("abort", abort_ws), ("overlap", overlap_ws)):
                ms, ok = await _one_abort(ws, mode == "overlap", rng.uniform(0.02, 0.08))
                found[mode].append(ms)
                wrong += not ok
    return {**{f"{mode}_{q}": percentile(v, q) for mode, v in found.items() for q in (50, 99)},
            "wrong_end": wrong}


async def _background(proc: Proc, index: int, streaming: asyncio.Event, ready: list[int],
                      total: int) -> None:
    """One document with runs back to back until cancelled."""
    ws, _ = await cowrite_join(proc, f"edit-bg-{index}", f"bg{index}")
    counted = False
    try:
        async with ws:
            while True:
                await ws.send(_start(BACKGROUND, False).decode())
                while True:
                    kind = orjson.loads(await ws.recv()).get("type")
                    if kind == "message.delta" and not counted:
                        counted = True
                        ready[0] += 1
                        if ready[0] == total:
                            streaming.set()
                    elif kind == "run.finished":
                        break
    except ConnectionClosed:
        return


@contextlib.asynccontextmanager
async def streaming_runs(proc: Proc, count: int) -> AsyncIterator[None]:
    """`count` documents with a run streaming on each, for the duration of the block."""
    streaming, ready = asyncio.Event(), [0]
    tasks = [asyncio.create_task(_background(proc, i, streaming, ready, count))
             for i in range(count)]
    try:
        await asyncio.wait_for(streaming.wait(), 60)
        yield
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class Watcher:
    """Reads one connection and counts what a user of it would see."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws, self.counts = ws, {"document.changed": 0, "run.scope": 0, "run.finished": 0}
        self.last_scope: list[dict[str, int]] | None = None
        self.finished: dict[str, Any] | None = None
        self.changed = asyncio.Event()
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        with contextlib.suppress(ConnectionClosed):
            async for raw in self.ws:
                event = orjson.loads(raw)
                kind = event.get("type")
                if kind in self.counts:
                    self.counts[kind] += 1
                    self.changed.set()
                if kind == "run.scope":
                    self.last_scope = event["scope"]
                elif kind == "run.finished":
                    self.finished = event

    async def wait_for(self, kind: str, count: int) -> None:
        while self.counts[kind] < count:
            self.changed.clear()
            await asyncio.wait_for(self.changed.wait(), 60)


def _edit(n: int) -> tuple[dict[str, int], int]:
    """The n-th edit outside the scope, alternating before it (shifts it) and after it;
    returns the change and how far it moves the scope."""
    if n % 2:
        return {"from": 3 * SCOPE[1], "to": 3 * SCOPE[1] + 2, "insert": 5}, 0
    return {"from": 10, "to": 12, "insert": 3}, 1  # 2 units replaced by 3: the scope moves by 1


async def _edit_window(proc: Proc, ws: ClientConnection, watcher: Watcher, kind: str,
                       first: int, edits: int) -> tuple[float, float]:
    """Send `edits` edits outside the scope; (server CPU s, wall s) until all were seen."""
    seen = watcher.counts[kind]
    cpu0, t0 = proc.cpu_s(), time.perf_counter()
    for n in range(first, first + edits):
        change, _ = _edit(n)
        await ws.send(orjson.dumps({"type": "editor.change", "document_version": n + 1,
                                    "changes": [change]}).decode())
    await watcher.wait_for(kind, seen + edits)
    return proc.cpu_s() - cpu0, time.perf_counter() - t0


async def _idle_window(proc: Proc, seconds: float) -> tuple[float, float]:
    cpu0, t0 = proc.cpu_s(), time.perf_counter()
    await asyncio.sleep(seconds)
    return proc.cpu_s() - cpu0, time.perf_counter() - t0


async def cpu_per_edit(proc: Proc, size: Sizes, with_run: bool) -> dict[str, Any]:
    """Server CPU per edit outside the scope of an `overlap` run (with_run) or on a
    document without a run, while the background runs stream."""
    tag = "run" if with_run else "norun"
    ws, _ = await cowrite_join(proc, f"edit-cpu-{tag}", "e")
    watcher = Watcher(ws)
    kind = "run.scope" if with_run else "document.changed"
    out: dict[str, Any] = {}
    async with ws:
        if with_run:
            await ws.send(_start(SLOW, True).decode())
        per_edit, loads = [], []
        base_cpu, base_wall = await _idle_window(proc, 0.5)
        for w in range(size.windows):
            cpu, wall = await _edit_window(proc, ws, watcher, kind, w * size.edits, size.edits)
            after_cpu, after_wall = await _idle_window(proc, max(0.5, wall))
            rate = (base_cpu + after_cpu) / (base_wall + after_wall)
            per_edit.append((cpu - rate * wall) / size.edits * 1e6)
            loads.append(rate)
            base_cpu, base_wall = after_cpu, after_wall
        sent = size.windows * size.edits
        out["cpu_us_per_edit"] = statistics.median(per_edit)
        out["cpu_us_windows"] = per_edit
        out["server_load"] = max(loads)
        out["edits"] = sent
        if with_run:
            shift = sum(_edit(n)[1] for n in range(sent))
            expected = [{"from": SCOPE[0] + shift, "to": SCOPE[1] + shift}]
            out["aborts"] = watcher.counts["run.finished"]
            out["run_scope_events"] = watcher.counts["run.scope"]
            out["scope_ok"] = watcher.last_scope == expected
            await ws.send('{"type":"editor.change"}')  # no ranges: overlaps, ends the run
            await watcher.wait_for("run.finished", 1)
            assert watcher.finished is not None
            out["ended_by_edit"] = watcher.finished.get("reason") == "document_changed"
    watcher.task.cancel()
    await asyncio.gather(watcher.task, return_exceptions=True)
    return out


async def measure(quick: bool = False) -> dict[str, Any]:
    size = Sizes.of(quick)
    out: dict[str, Any] = {"sizes": size.__dict__}
    async with server_process("cowrite") as cowrite:
        out["idle"] = await abort_rounds(cowrite, size.idle_rounds, "idle")
        async with streaming_runs(cowrite, size.busy_runs):
            out["busy"] = await abort_rounds(cowrite, size.rounds, "busy")
            out["cpu_run"] = await cpu_per_edit(cowrite, size, with_run=True)
            out["cpu_norun"] = await cpu_per_edit(cowrite, size, with_run=False)
    return out


def rows(m: dict[str, Any]) -> list[tuple[str, str, str, str, str, bool]]:
    """Rows for bench.issue's table: (figure, cowrite, baseline, ratio, goal, met)."""
    size, idle, busy, run, norun = (m["sizes"], m["idle"], m["busy"], m["cpu_run"],
                                    m["cpu_norun"])
    streams = f"{size['busy_runs']} runs streaming on other documents"
    out = []
    for mode, other in (("overlap", "abort"), ("abort", "overlap")):
        label = ("`overlap` mode, edit inside the scope" if mode == "overlap"
                 else "default `abort` mode, same edit")
        ratio = (f"{busy[f'{mode}_99'] / busy[f'{other}_99']:.2f}x abort mode (p99, "
                 "streaming)" if mode == "overlap" else "")
        out.append((
            f"abort p50 / p99 (editor.change -> run.finished), {label}: idle "
            f"({size['idle_rounds']} rounds); {streams} ({size['rounds']} rounds)",
            f"{idle[f'{mode}_50']:.1f} / {idle[f'{mode}_99']:.1f} ms; "
            f"{busy[f'{mode}_50']:.1f} / {busy[f'{mode}_99']:.1f} ms", "-", ratio,
            "p99 <= 2 / 20 ms",
            idle[f"{mode}_99"] <= 2 and busy[f"{mode}_99"] <= 20
            and idle["wrong_end"] + busy["wrong_end"] == 0))
    verified = (run["aborts"] == 0 and run["run_scope_events"] == run["edits"]
                and run["scope_ok"] and run["ended_by_edit"])
    out.append((
        f"server CPU per edit outside the scope (`overlap` run), {streams}; bare column: "
        f"the same edit to a document without a run ({run['edits']:,} edits: "
        f"{run['aborts']} aborts, {run['run_scope_events']:,} run.scope, final scope "
        f"{'right' if run['scope_ok'] else 'WRONG'})",
        f"{run['cpu_us_per_edit']:.0f} us", f"{norun['cpu_us_per_edit']:.0f} us",
        f"{run['cpu_us_per_edit'] / norun['cpu_us_per_edit']:.2f}x"
        if norun["cpu_us_per_edit"] > 0 else "", "0 aborts", verified))
    return out


def main() -> None:
    """`python -m bench.editbench [--quick]`: these rows alone, printed."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller runs, for a smoke test")
    m = asyncio.run(measure(parser.parse_args().quick))
    print(orjson.dumps(m, option=orjson.OPT_INDENT_2).decode())
    for row in rows(m):
        print(" | ".join(str(cell) for cell in row))


if __name__ == "__main__":
    main()
