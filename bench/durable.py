"""Issue 12: what durable runs (PROTOCOL.md section 13) cost, and how fast they recover.

- Takeover time: two instances on one throwaway redis-server (never the machine's
  6379), `COWRITE_RUN_LEASE_S=1`. A client of the owner starts a run that waits on a
  client tool call; at a random point of the lease renewal period the owner gets
  SIGKILL, and the figure is the time from the kill to `run.resumed` at a client of
  the survivor. Then that client cancels the run, and its events up to the one
  `run.finished` must hold exactly one `run.resumed` (`owner_lost`). 50 kills, a
  fresh owner each time, forked by `bench.forkserver` (a `python -m server` start is
  1.5 s of CPU here, nearly all imports).
- Checkpoint cost: one instance in Redis mode with checkpoints (the default) and one
  with `COWRITE_DURABLE_RUNS=0` (no checkpoints, 1.0's behaviour), same Redis, same
  invocation, rounds alternating between them: the tool round trip p50 of
  `bench.runs.tool_round_trips` and the text throughput of `bench.issue.cowrite_text`,
  and the memory backend beside them for reference. Each round uses fresh documents,
  so no run starts with another's history.

`python -m bench.run --durable` prints these rows alone.
"""

import asyncio
import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from websockets.asyncio.client import ClientConnection

from bench import issue, runs
from bench.common import (
    CLOCK_TICKS,
    READ_TOOL,
    SERVER_CORE,
    cowrite_join,
    free_port,
    percentile,
    pin,
    redis_server,
    script_prompt,
    server_env,
    wait_ready,
)

LEASE_S = 1.0
WAIT_S = 15.0  # for any one event: a takeover not seen by then counts as failed
MODES = ("on", "off", "memory")


@dataclass(frozen=True)
class Sizes:
    kills: int
    calls: int
    chars: int
    rounds: int

    @staticmethod
    def of(quick: bool) -> "Sizes":
        return Sizes(5, 50, 20_000, 1) if quick else Sizes(50, 300, 200_000, 3)


@dataclass
class Instance:
    """A cowrite instance forked by `bench.forkserver` (not this process's child)."""

    pid: int
    port: int

    def url(self, path: str, scheme: str = "ws") -> str:
        return f"{scheme}://127.0.0.1:{self.port}{path}"

    def alive(self) -> bool:
        return os.path.exists(f"/proc/{self.pid}")

    def cpu_s(self) -> float:
        with open(f"/proc/{self.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


@dataclass
class Forks:
    process: asyncio.subprocess.Process
    instances: list[Instance] = field(default_factory=list)

    async def spawn(self, **env: str) -> Instance:
        """A new instance with `env` over the bench defaults, once `/healthz` answers."""
        assert self.process.stdin is not None and self.process.stdout is not None
        port = free_port()
        self.process.stdin.write(orjson.dumps({"env": server_env(port, **env)}) + b"\n")
        await self.process.stdin.drain()
        instance = Instance(int(orjson.loads(await self.process.stdout.readline())["pid"]), port)
        self.instances.append(instance)
        await wait_ready(instance)
        return instance

    async def stop_all(self) -> None:
        """SIGTERM every instance still alive and wait until they are gone (SIGKILL
        after 10 s), so the next benchmark starts on a quiet core."""
        alive = [i for i in self.instances if i.alive()]
        for instance in alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(instance.pid, signal.SIGTERM)
        for _ in range(200):  # 10 s; not our children, so there is nothing to await
            if not any(i.alive() for i in alive):
                break
            await asyncio.sleep(0.05)
        for instance in alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(instance.pid, signal.SIGKILL)


@contextlib.asynccontextmanager
async def fork_server() -> AsyncIterator[Forks]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.forkserver", stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=None if os.environ.get("BENCH_SERVER_LOGS") else subprocess.DEVNULL)
    pin(process.pid, SERVER_CORE)  # its children inherit the core
    forks = Forks(process)
    try:
        yield forks
    finally:
        await forks.stop_all()
        if process.stdin is not None:
            process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), 10)
        except TimeoutError:
            process.kill()
            await process.wait()


async def _until(ws: ClientConnection, kind: str) -> dict[str, Any]:
    while True:
        event: dict[str, Any] = orjson.loads(await ws.recv())
        if event.get("type") == kind:
            return event


async def _rest_of_run(ws: ClientConnection, run_id: str) -> list[dict[str, Any]]:
    """The run's events up to and including its `run.finished`."""
    events = []
    while True:
        event = orjson.loads(await ws.recv())
        if event.get("run_id") == run_id:
            events.append(event)
            if event.get("type") == "run.finished":
                return events


async def one_takeover(survivor: Instance, owner: Instance, document_id: str,
                       delay_s: float) -> tuple[float | None, int]:
    """Kill `owner` while its run waits on a client tool call: (seconds from the kill to
    `run.resumed` at a client of `survivor`, None if none came; `run.resumed` events
    the run logged before its one `run.finished`)."""
    watcher, _ = await cowrite_join(survivor, document_id, "watch")
    starter, _ = await cowrite_join(owner, document_id, "tab")
    run_id = f"{document_id}-run"
    try:
        await starter.send(orjson.dumps({
            "type": "run.start", "run_id": run_id, "tools": [READ_TOOL],
            "prompt": script_prompt("done", 4, tool_steps=1)}).decode())
        await asyncio.wait_for(_until(starter, "tool.call"), WAIT_S)
        await asyncio.sleep(delay_s)
        killed_at = time.perf_counter()
        os.kill(owner.pid, signal.SIGKILL)
        try:
            resumed = await asyncio.wait_for(_until(watcher, "run.resumed"), WAIT_S)
        except TimeoutError:
            return None, 0
        took = time.perf_counter() - killed_at
        count = int(resumed["reason"] == "owner_lost")
        await watcher.send(orjson.dumps({"type": "run.cancel", "run_id": run_id}).decode())
        rest = await asyncio.wait_for(_rest_of_run(watcher, run_id), WAIT_S)
        count += sum(1 for event in rest if event["type"] == "run.resumed")
        return took, count
    finally:
        await asyncio.gather(starter.close(), watcher.close(), return_exceptions=True)


async def takeovers(forks: Forks, redis_url: str, kills: int) -> dict[str, Any]:
    env = {"COWRITE_REDIS_URL": redis_url, "COWRITE_RUN_LEASE_S": f"{LEASE_S:g}"}
    rng = random.Random(12)
    survivor = await forks.spawn(**env)
    times: list[float] = []
    once = 0
    for kill in range(kills):
        owner = await forks.spawn(**env)
        # at any phase of the owner's renewals (every third of the lease)
        took, resumed = await one_takeover(survivor, owner, f"takeover-{kill}",
                                           rng.uniform(0, LEASE_S / 3))
        if took is not None:
            times.append(took * 1000)
        once += resumed == 1
    return {"lease_s": LEASE_S, "kills": kills, "resumed": len(times), "resumed_once": once,
            "p50_ms": percentile(times, 50), "p99_ms": percentile(times, 99),
            "max_ms": max(times, default=float("nan"))}


@dataclass
class Tally:
    """One mode's figures over the rounds of `checkpoint_cost`."""

    trips: list[float] = field(default_factory=list)
    first: list[float] = field(default_factory=list)  # the first 50 round trips of each run
    last: list[float] = field(default_factory=list)  # and the last 50
    tool_cpu_s: float = 0.0
    rates: list[float] = field(default_factory=list)
    text_cpu_s: float = 0.0

    def summary(self, calls: int, texts: int) -> dict[str, float]:
        return {"tool_p50_ms": percentile(self.trips, 50),
                "tool_p99_ms": percentile(self.trips, 99),
                "tool_first_50_p50_ms": percentile(self.first, 50),
                "tool_last_50_p50_ms": percentile(self.last, 50),
                "tool_cpu_us": self.tool_cpu_s / calls * 1e6,
                "chars_per_s": percentile(self.rates, 50),
                "text_cpu_s": self.text_cpu_s / texts}


async def checkpoint_cost(forks: Forks, redis_url: str, size: Sizes) -> dict[str, Any]:
    instances = {
        "on": await forks.spawn(COWRITE_REDIS_URL=redis_url),
        "off": await forks.spawn(COWRITE_REDIS_URL=redis_url, COWRITE_DURABLE_RUNS="0"),
        "memory": await forks.spawn(),
    }
    tallies = {mode: Tally() for mode in MODES}
    text_ok = True
    for round_ in range(size.rounds):  # alternating, so drift on the machine hits all three
        for mode, instance in instances.items():
            tally = tallies[mode]
            before = instance.cpu_s()
            seconds, _, text = await issue.cowrite_text(instance, size.chars,
                                                        f"text-{mode}-{round_}")
            tally.text_cpu_s += instance.cpu_s() - before
            text_ok = text_ok and text == "y" * size.chars
            tally.rates.append(size.chars / seconds)
            before = instance.cpu_s()
            found = await runs.tool_round_trips(instance, size.calls, f"tools-{mode}-{round_}")
            tally.tool_cpu_s += instance.cpu_s() - before
            tally.trips += found
            tally.first += found[:50]  # a checkpoint holds the whole conversation: does
            tally.last += found[-50:]  # a round trip cost more late in a long run?
    out: dict[str, Any] = {"text_ok": text_ok}
    for mode in MODES:
        out[mode] = tallies[mode].summary(size.calls * size.rounds, size.rounds)
    return out


async def measure(quick: bool = False) -> dict[str, Any]:
    size = Sizes.of(quick)
    out: dict[str, Any] = {"sizes": size.__dict__}
    async with fork_server() as forks:
        async with redis_server() as redis_url:
            out["takeover"] = await takeovers(forks, redis_url, size.kills)
            await forks.stop_all()
        async with redis_server() as redis_url:  # a fresh one: nothing left by the kills
            out["cost"] = await checkpoint_cost(forks, redis_url, size)
    return out


def rows(m: dict[str, Any]) -> list[tuple[str, str, str, str, str, bool]]:
    """Rows for bench.issue's table: (figure, cowrite, baseline, ratio, goal, met)."""
    t, c, size = m["takeover"], m["cost"], m["sizes"]
    on, off, memory = c["on"], c["off"], c["memory"]
    lease = f"{t['lease_s']:g} s"
    return [
        (f"takeover time p50 / p99 over {t['kills']} kills (lease {lease}): `kill -9` of the "
         "owner of a run waiting on a client tool call -> `run.resumed` at a client of the "
         f"survivor (resumed exactly once: {t['resumed_once']} of {t['kills']})",
         f"{t['p50_ms']:,.0f} / {t['p99_ms']:,.0f} ms", "-", "", "<= lease + 1 s",
         t["resumed_once"] == t["kills"] and t["p99_ms"] <= (t["lease_s"] + 1) * 1000),
        ("checkpoint cost: tool round trip p50 / text throughput, Redis with vs without "
         "checkpoints (`COWRITE_DURABLE_RUNS=0`; bare column), "
         f"{size['rounds']} alternating round{'s' if size['rounds'] != 1 else ''} of a "
         f"{size['calls']}-call run and "
         f"{size['chars']:,} chars; server CPU per round trip {on['tool_cpu_us']:,.0f} vs "
         f"{off['tool_cpu_us']:,.0f} us; memory backend: "
         f"{memory['tool_p50_ms'] * 1000:,.0f} us / {memory['chars_per_s']:,.0f} chars/s",
         f"{on['tool_p50_ms'] * 1000:,.0f} us / {on['chars_per_s']:,.0f} chars/s",
         f"{off['tool_p50_ms'] * 1000:,.0f} us / {off['chars_per_s']:,.0f} chars/s",
         f"{on['tool_p50_ms'] / off['tool_p50_ms']:.2f}x / "
         f"{on['chars_per_s'] / off['chars_per_s']:.2f}x", "none set; text intact",
         bool(c["text_ok"])),
    ]
