"""`python -m bench.load`: a load generator that verifies what it receives.

It opens `--docs` document sessions with `--collaborators` connections each
and, per document, drives `--runs` scripted agent runs (`--deltas` deltas and
`--tools` client tool calls each, `--approvals` of them behind an approval);
the first connection of a document executes the tools and answers the
approvals. It injects `run.cancel` and user `editor.change` (abort) at the
chosen rates, and drops and resumes the chosen fraction of connections
mid-run. Every stream is checked: seq gapless, no duplicates, deltas equal
`message.done`, exactly one `run.finished` per run, no tool executed twice,
every resume resumed. It prints a live progress line and a summary, and
writes JSON and Markdown reports.

Examples:
  python -m bench.load --spawn --docs 200 --runs 1 --edit-rate 0.2
  python -m bench.load --url ws://127.0.0.1:8000 --docs 10   # a server started with
      COWRITE_JWT_SECRET=bench-secret-0123456789abcdef0123456789 (bench/common.py)
  python -m bench.load --spawn --redis --docs 100 --collaborators 2
"""

import argparse
import asyncio
import contextlib
import gc
import random
import resource
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Coroutine
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from bench.common import (
    CLIENT_CORE,
    LoopLag,
    Proc,
    bench_token,
    percentile,
    pin,
    process_cpu_s,
    redis_server,
    server_process,
)

RESULTS = Path(__file__).resolve().parent / "results"
TOOLS = [
    {"name": "read_document", "description": "Read the document.",
     "parameters": {"type": "object", "properties": {}}},
    {"name": "replace_document", "description": "Replace the document.", "requires_approval": True,
     "parameters": {"type": "object", "properties": {"text": {"type": "string"}},
                    "required": ["text"]}},
]


@dataclass
class Scenario:
    name: str = "custom"
    docs: int = 10
    collaborators: int = 1
    runs: int = 1
    deltas: int = 200
    tools: int = 3
    approvals: int = 0
    chunk_chars: int = 4
    delay_ms: float = 10.0
    catch_up: bool = False  # the scripted model keeps its own clock (see server/agent/scripted.py)
    cancel_rate: float = 0.0
    edit_rate: float = 0.0
    drop_rate: float = 0.0
    idle: bool = False  # connect, hold, verify nothing arrives; no runs
    ramp_s: float = 1.0
    run_timeout_s: float = 60.0
    seed: int = 1


@dataclass
class Stats:
    connect_ms: list[float] = field(default_factory=list)
    run_started_ms: list[float] = field(default_factory=list)
    first_delta_ms: list[float] = field(default_factory=list)
    inter_arrival_ms: list[float] = field(default_factory=list)
    tool_rtt_ms: list[float] = field(default_factory=list)
    abort_ms: list[float] = field(default_factory=list)
    events: int = 0
    runs_finished: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)  # verification failures
    server_errors: Counter[str] = field(default_factory=Counter)  # `error` events by code
    resumes: int = 0


def script(scenario: Scenario, run_index: int, approvals_left: int) -> str:
    steps: list[dict[str, Any]] = []
    for tool in range(scenario.tools):
        name = "replace_document" if tool < approvals_left else "read_document"
        arguments = {"text": f"run {run_index}"} if name == "replace_document" else {}
        steps.append({"say": f"step {tool}. ", "tool_calls": [{"name": name,
                                                               "arguments": arguments}]})
    steps.append({"say": "".join(f"{i % 10}" * scenario.chunk_chars
                                 for i in range(scenario.deltas))})
    return orjson.dumps({"script": steps, "chunk_chars": scenario.chunk_chars,
                        "delay_ms": scenario.delay_ms, "catch_up": scenario.catch_up}).decode()


class LoadClient:
    """One connection: verifies its stream, executes tools if it is the driver."""

    def __init__(self, url: str, token: str, client_id: str, stats: Stats, driver: bool) -> None:
        self.url, self.token, self.client_id = url, token, client_id
        self.stats, self.driver = stats, driver
        self.ws: ClientConnection | None = None
        self.epoch = ""
        self.last_seq = 0
        self.text: dict[str, list[str]] = defaultdict(list)
        self.finished: dict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self.finish_count: Counter[str] = Counter()
        self.started: dict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self.first_delta: dict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self.executed: set[str] = set()
        self.tool_done: Counter[str] = Counter()
        self.result_sent: dict[str, float] = {}
        self.last_delta_at: dict[str, float] = {}
        self.reader: asyncio.Task[None] | None = None

    async def connect(self, resume: bool = False) -> None:
        t0 = time.perf_counter()
        self.ws = await connect(self.url, compression=None, max_size=None, ping_interval=None,
                                open_timeout=60)
        hello: dict[str, Any] = {"type": "hello", "protocol": 1, "client_id": self.client_id,
                                 "token": self.token}
        if resume:
            hello["resume"] = {"epoch": self.epoch, "after_seq": self.last_seq}
        await self.ws.send(orjson.dumps(hello).decode())
        welcome = orjson.loads(await self.ws.recv())
        if welcome.get("type") != "welcome":
            raise RuntimeError(f"no welcome: {welcome}")
        self.stats.connect_ms.append((time.perf_counter() - t0) * 1000)
        if resume:
            self.stats.resumes += 1
            if not welcome["resumed"]:
                self.stats.errors["resume_failed"] += 1
                self.last_seq = welcome["last_seq"]
        else:
            self.last_seq = welcome["last_seq"]
        self.epoch = welcome["epoch"]
        self.reader = asyncio.create_task(self._read(self.ws))

    async def send(self, message: dict[str, Any]) -> None:
        if self.ws is not None:
            with contextlib.suppress(ConnectionClosed):
                await self.ws.send(orjson.dumps(message).decode())

    async def drop_and_resume(self) -> None:
        """Lose the connection mid-run (as a network blip would) and resume."""
        await self.close()
        await self.connect(resume=True)

    async def close(self) -> None:
        if self.reader is not None:
            self.reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.reader
        if self.ws is not None:
            await self.ws.close()

    async def _read(self, ws: ClientConnection) -> None:
        with contextlib.suppress(ConnectionClosed):
            async for raw in ws:
                self._on_event(orjson.loads(raw), time.perf_counter())

    def _on_event(self, event: dict[str, Any], now: float) -> None:
        stats = self.stats
        seq = event.get("seq")
        if seq is not None:
            if seq <= self.last_seq:
                stats.errors["duplicate_event"] += 1
                return
            if seq != self.last_seq + 1:
                stats.errors["seq_gap"] += 1
            self.last_seq = seq
        stats.events += 1
        kind, run_id = event["type"], event.get("run_id", "")
        if kind == "message.delta":
            message_id = event["message_id"]
            self.text[message_id].append(event["delta"])
            previous = self.last_delta_at.get(message_id)
            if previous is not None:
                stats.inter_arrival_ms.append((now - previous) * 1000)
            self.last_delta_at[message_id] = now
            self.first_delta[run_id].set()
            sent = self.result_sent.pop(run_id, None)
            if sent is not None:
                stats.tool_rtt_ms.append((now - sent) * 1000)
        elif kind == "message.done":
            if "".join(self.text.pop(event["message_id"], [])) != event["text"]:
                stats.errors["deltas_differ_from_done"] += 1
        elif kind == "run.started":
            self.started[run_id].set()
        elif kind == "run.finished":
            self.finish_count[run_id] += 1
            if self.finish_count[run_id] > 1:
                stats.errors["run_finished_twice"] += 1
            if self.driver:
                stats.runs_finished[event["status"]] += 1
            self.finished[run_id].set()
        elif kind == "tool.done":
            self.tool_done[event["call_id"]] += 1
            if self.tool_done[event["call_id"]] > 1:
                stats.errors["tool_done_twice"] += 1
        elif kind == "error":
            stats.server_errors[event["code"]] += 1
        if self.driver:
            self._drive(event, now)

    def _drive(self, event: dict[str, Any], now: float) -> None:
        kind = event["type"]
        if kind == "tool.call" and event.get("client_id") == self.client_id:
            sent = self.result_sent.pop(event["run_id"], None)
            if sent is not None:
                self.stats.tool_rtt_ms.append((now - sent) * 1000)
            if event["call_id"] in self.executed:
                self.stats.errors["tool_executed_twice"] += 1
                return
            self.executed.add(event["call_id"])
            self.result_sent[event["run_id"]] = time.perf_counter()
            asyncio.get_running_loop().create_task(self.send({
                "type": "tool.result", "run_id": event["run_id"], "call_id": event["call_id"],
                "token": event["token"], "output": {"text": "load test document"}}))
        elif kind == "approval.requested":
            asyncio.get_running_loop().create_task(self.send({
                "type": "approval", "run_id": event["run_id"], "call_id": event["call_id"],
                "decision": "approve"}))


async def drive_document(index: int, scenario: Scenario, urls: list[str], stats: Stats,
                         rng: random.Random, done: Counter[str]) -> None:
    await asyncio.sleep(rng.uniform(0, scenario.ramp_s))
    document_id = f"load-{scenario.name}-{index}"
    clients = [LoadClient(f"{urls[(index + k) % len(urls)]}/v1/documents/{document_id}/ws",
                          bench_token(f"user-{index}-{k}"), f"c{index}-{k}", stats, k == 0)
               for k in range(scenario.collaborators)]
    for client in clients:
        await client.connect()
    try:
        if scenario.idle:
            done["docs"] += 1
            await _idle_until_released(clients)
            return
        driver = clients[0]
        for run_index in range(scenario.runs):
            await _one_run(index, run_index, scenario, clients, driver, stats, rng)
            done["runs"] += 1
        done["docs"] += 1
    finally:
        if not scenario.idle:
            await asyncio.gather(*(c.close() for c in clients))


IDLE_RELEASE = asyncio.Event()


async def _idle_until_released(clients: list[LoadClient]) -> None:
    """Hold the connections open until the scenario has read the server's memory."""
    try:
        await IDLE_RELEASE.wait()
    finally:
        await asyncio.gather(*(c.close() for c in clients))


async def _one_run(index: int, run_index: int, scenario: Scenario, clients: list[LoadClient],
                   driver: LoadClient, stats: Stats, rng: random.Random) -> None:
    run_id = f"r{index}-{run_index}"
    t0 = time.perf_counter()
    await driver.send({"type": "run.start", "run_id": run_id, "tools": TOOLS,
                       "prompt": script(scenario, run_index, scenario.approvals),
                       "options": {"max_steps": scenario.tools + 2}})
    try:
        await asyncio.wait_for(driver.started[run_id].wait(), scenario.run_timeout_s)
        stats.run_started_ms.append((time.perf_counter() - t0) * 1000)
        await asyncio.wait_for(driver.first_delta[run_id].wait(), scenario.run_timeout_s)
        stats.first_delta_ms.append((time.perf_counter() - t0) * 1000)
        roll = rng.random()
        if roll < scenario.cancel_rate + scenario.edit_rate:
            await asyncio.sleep(rng.uniform(0, 0.05))
            sender = driver if roll < scenario.cancel_rate else rng.choice(clients)
            sent = time.perf_counter()
            await sender.send({"type": "run.cancel", "run_id": run_id} if roll <
                              scenario.cancel_rate else {"type": "editor.change"})
            await asyncio.wait_for(sender.finished[run_id].wait(), scenario.run_timeout_s)
            stats.abort_ms.append((time.perf_counter() - sent) * 1000)
        droppers = [c for c in clients if rng.random() < scenario.drop_rate]
        for client in droppers:
            await client.drop_and_resume()
        for client in clients:
            await asyncio.wait_for(client.finished[run_id].wait(), scenario.run_timeout_s)
    except TimeoutError:
        stats.errors["run_timed_out_in_load_generator"] += 1


async def _progress(scenario: Scenario, stats: Stats, done: Counter[str], stop: asyncio.Event
                    ) -> None:
    total = scenario.docs * (1 if scenario.idle else scenario.runs)
    t0 = time.perf_counter()
    while not stop.is_set():
        finished = done["docs"] if scenario.idle else done["runs"]
        width = 30
        filled = int(width * finished / max(1, total))
        line = (f"\r{scenario.name:>14} [{'#' * filled}{'.' * (width - filled)}] "
                f"{finished}/{total} {'docs' if scenario.idle else 'runs'}  "
                f"events {stats.events:,}  errors {sum(stats.errors.values())}  "
                f"{time.perf_counter() - t0:5.1f}s")
        print(line, end="", file=sys.stderr, flush=True)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.5)
    print(file=sys.stderr)


def summarize(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    return {"p50": percentile(values, 50), "p95": percentile(values, 95),
            "p99": percentile(values, 99), "max": max(values), "n": len(values)}


async def run_scenario(scenario: Scenario, urls: list[str], procs: list[Proc],
                       progress: bool = True) -> dict[str, Any]:
    """Run `scenario` and report it. The generator's own garbage collector is off
    meanwhile: a full collection of its thousands of connections' objects stopped
    it for up to ~100 ms, which it would have measured as the server's latency."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        return await _run_scenario(scenario, urls, procs, progress)
    finally:
        if collecting:
            gc.enable()


async def _run_scenario(scenario: Scenario, urls: list[str], procs: list[Proc],
                        progress: bool) -> dict[str, Any]:
    stats, done = Stats(), Counter[str]()
    rng = random.Random(scenario.seed)
    IDLE_RELEASE.clear()
    cpu0 = [p.cpu_s() for p in procs]
    rss0 = [p.rss_bytes() for p in procs]
    stop = asyncio.Event()
    bar = asyncio.create_task(_progress(scenario, stats, done, stop)) if progress else None
    lag = LoopLag()
    lag.start()
    client_cpu0 = process_cpu_s()
    t0 = time.perf_counter()
    tasks = [asyncio.create_task(drive_document(i, scenario, urls, stats, random.Random(
        rng.random()), done)) for i in range(scenario.docs)]
    idle_rss = 0
    if scenario.idle:
        # poll a counter that many tasks bump; stop early if one of them failed
        while done["docs"] < scenario.docs and not any(t.done() for t in tasks):  # noqa: ASYNC110
            await asyncio.sleep(0.2)
        await asyncio.sleep(1.0)
        idle_rss = sum(p.rss_bytes() for p in procs) - sum(rss0)
        IDLE_RELEASE.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    elapsed = time.perf_counter() - t0
    client_cpu = process_cpu_s() - client_cpu0
    client_lag = await lag.stop()
    for result in results:
        if isinstance(result, BaseException):
            stats.errors[f"client_exception:{type(result).__name__}"] += 1
    stop.set()
    if bar is not None:
        await bar
    connections = scenario.docs * scenario.collaborators
    report: dict[str, Any] = {
        "scenario": asdict(scenario), "seconds": elapsed, "connections": connections,
        "runs_finished": dict(stats.runs_finished),
        "runs_per_s": sum(stats.runs_finished.values()) / elapsed,
        "events": stats.events, "events_per_s": stats.events / elapsed,
        "resumes": stats.resumes,
        "verification_errors": dict(stats.errors),
        "server_errors": dict(stats.server_errors),
        "connect_ms": summarize(stats.connect_ms),
        "run_started_ms": summarize(stats.run_started_ms),
        "first_delta_ms": summarize(stats.first_delta_ms),
        "delta_inter_arrival_ms": summarize(stats.inter_arrival_ms),
        "tool_rtt_ms": summarize(stats.tool_rtt_ms),
        "abort_ms": summarize(stats.abort_ms),
        # the generator's own load: near 1.0 busy or a lagging loop means the
        # figures above measure the client as much as the server
        "client_cpu_s": client_cpu, "client_cpu_busy": client_cpu / elapsed,
        "client_loop_lag_ms": summarize(client_lag),
    }
    if procs:
        report["server_cpu_s"] = sum(p.cpu_s() for p in procs) - sum(cpu0)
        report["server_cpu_busy"] = report["server_cpu_s"] / elapsed / len(procs)
        report["server_rss_mib"] = sum(p.rss_bytes() for p in procs) / 2**20
        if scenario.idle:
            report["idle_kib_per_connection"] = idle_rss / connections / 1024
        if stats.events:
            report["server_cpu_us_per_event"] = report["server_cpu_s"] / stats.events * 1e6
    return report


def markdown(report: dict[str, Any]) -> str:
    s = report["scenario"]
    lines = [f"### {s['name']}", "",
             f"{s['docs']} documents x {s['collaborators']} connections, {s['runs']} run(s) "
             f"each ({s['deltas']} deltas, {s['tools']} tool calls); cancel {s['cancel_rate']:.0%}"
             f", abort by edit {s['edit_rate']:.0%}, drop+resume {s['drop_rate']:.0%}.", "",
             "| measure | p50 | p95 | p99 | max |", "|---|---|---|---|---|"]
    for key in ("connect_ms", "run_started_ms", "first_delta_ms", "delta_inter_arrival_ms",
                "tool_rtt_ms", "abort_ms"):
        values = report[key]
        if values:
            lines.append(f"| {key.replace('_ms', '')} (ms) | {values['p50']:.2f} | "
                         f"{values['p95']:.2f} | {values['p99']:.2f} | {values['max']:.2f} |")
    lines += ["", f"runs/s {report['runs_per_s']:.1f}, events/s {report['events_per_s']:,.0f}, "
              f"finished {report['runs_finished']}, resumes {report['resumes']}, "
              f"verification errors {report['verification_errors'] or 0}, "
              f"server errors {report['server_errors'] or 0}"]
    lag = report.get("client_loop_lag_ms") or {}
    if lag:
        lines.append(f"load generator: CPU {report['client_cpu_s']:.1f} s "
                     f"({report['client_cpu_busy']:.0%} of a core), loop lag p99 "
                     f"{lag['p99']:.1f} ms, max {lag['max']:.1f} ms")
    if "server_cpu_s" in report:
        lines.append(f"server CPU {report['server_cpu_s']:.1f} s "
                     f"({report['server_cpu_busy']:.0%} of a core per instance), RSS "
                     f"{report['server_rss_mib']:.0f} MiB"
                     + (f", {report['idle_kib_per_connection']:.1f} KiB per idle connection"
                        if "idle_kib_per_connection" in report else ""))
    return "\n".join(lines) + "\n"


def save(report: dict[str, Any]) -> Path:
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{report['scenario']['name']}"
    path.with_suffix(".json").write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    path.with_suffix(".md").write_text(markdown(report))
    return path


@contextlib.asynccontextmanager
async def local_servers(redis: bool) -> Any:
    """One spawned instance, or two sharing a spawned redis-server."""
    env = {"COWRITE_MAX_CONNECTIONS_PER_USER": "0", "COWRITE_OUTBOUND_QUEUE_MAX": "100000"}
    async with contextlib.AsyncExitStack() as stack:
        if redis:
            url = await stack.enter_async_context(redis_server())
            procs = [await stack.enter_async_context(server_process(
                "cowrite", COWRITE_REDIS_URL=url, **env)) for _ in range(2)]
        else:
            procs = [await stack.enter_async_context(server_process("cowrite", **env))]
        yield procs


def _run(main: Coroutine[Any, Any, dict[str, Any]]) -> dict[str, Any]:
    """The generator's loop: uvloop where installed (the server's own loop), which
    costs the generator about a third less CPU per event than asyncio's, so that at
    1,000 connections it measures the server rather than itself."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = Scenario()
    parser.add_argument("--url", help="ws://host:port of a running server (else --spawn)")
    parser.add_argument("--spawn", action="store_true", help="start a local server")
    parser.add_argument("--redis", action="store_true", help="with --spawn: two instances + redis")
    parser.add_argument("--name", default="custom")
    for name in ("docs", "collaborators", "runs", "deltas", "tools", "approvals", "chunk_chars",
                 "seed"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int,
                            default=getattr(defaults, name))
    for name in ("delay_ms", "cancel_rate", "edit_rate", "drop_rate", "ramp_s",
                 "run_timeout_s"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=float,
                            default=getattr(defaults, name))
    parser.add_argument("--idle", action="store_true", help="connect and hold, no runs")
    parser.add_argument("--catch-up", action="store_true",
                        help="scripted pieces due on the model's clock, merged when late")
    parser.add_argument("--no-progress", action="store_true", help="no progress line")
    args = parser.parse_args()
    if not args.url and not args.spawn:
        parser.error("give --url of a running server, or --spawn")
    scenario = Scenario(**{k: getattr(args, k) for k in asdict(defaults)})
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    pin(0, CLIENT_CORE)  # as in `make bench`: spawned servers are pinned to the other core

    async def go() -> dict[str, Any]:
        progress = not args.no_progress
        if args.url:
            return await run_scenario(scenario, [args.url.rstrip("/")], [], progress)
        async with local_servers(args.redis) as procs:
            return await run_scenario(scenario, [p.url("") for p in procs], procs, progress)

    report = _run(go())
    print(markdown(report))
    print(f"saved {save(report)}.json and .md")
    failed = sum(report["verification_errors"].values())
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
