"""A chaos soak: several instances on one Redis, clients running tool-using runs on
many documents while instances are killed, drained and restarted and Redis is paused.

    python -m tests.chaos --seconds 300 [--instances 3] [--documents 12] [--seed 1]

Not part of `make test` (it runs for minutes and its faults land at random points);
the tests pin each fault at an exact point instead. What it finds, it prints with
the seed that found it. Every document has one editor tab (a client id of its own,
reconnecting to a random live instance with `resume` after every drop) that starts
runs one after the other (text, client tool calls, now and then an approval, an
edit that aborts, a cancel) and answers what the runs ask. At the end the faults
stop and every document must:
- finish the run it was on and then run one more to its end (no document wedged);
- have a log whose seqs run 1..last without a gap, in which every run started once
  and finished once, nothing of a run follows its `run.finished`, and no call is
  asked or done twice;
- have been shown to its tab exactly as logged: every seq once, in order, equal to
  the logged event, across every reconnect (a resume that failed is counted).
Exit status 1 when any of that fails.
"""

import argparse
import asyncio
import contextlib
import os
import random
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
import websockets

from bench.common import Proc, server_process
from tests.chaos_audit import Findings, audit
from tests.harness import SECRET, token
from tests.redis_support import RedisProcess, redis_process
from tests.runs import EDITOR_TOOLS, call, script

ENV = {"COWRITE_REDIS_URL": "", "COWRITE_JWT_SECRET": SECRET, "COWRITE_RUN_LEASE_S": "2",
       "COWRITE_TOOL_TIMEOUT_S": "30", "COWRITE_APPROVAL_TIMEOUT_S": "30",
       "COWRITE_LOG_LEVEL": "error", "COWRITE_LOG_MAX_EVENTS": "200000"}  # audited whole
FINISH_S = 90.0  # after the faults stop: the runs in flight end, one more runs


class Instances:
    """`count` cowrite processes on one Redis, each restartable in its slot."""

    def __init__(self, redis: RedisProcess, count: int) -> None:
        self.redis, self.count = redis, count
        self.slots: list[tuple[Any, Proc] | None] = [None] * count

    async def start(self, slot: int) -> None:
        manager = server_process("cowrite", **{**ENV, "COWRITE_REDIS_URL": self.redis.url})
        proc = await manager.__aenter__()
        self.slots[slot] = (manager, proc)

    async def stop(self, slot: int, how: str) -> None:
        held = self.slots[slot]
        if held is None:
            return
        self.slots[slot] = None
        manager, proc = held
        if how == "kill":
            proc.process.kill()
        await manager.__aexit__(None, None, None)  # SIGTERM (a drain) when still running

    def live(self) -> list[Proc]:
        return [held[1] for held in self.slots if held is not None]

    async def close(self) -> None:
        for slot in range(self.count):
            await self.stop(slot, "term")


async def monkey(instances: Instances, redis: RedisProcess, rng: random.Random,
                 until: float, findings: Findings) -> None:
    """A fault every 1-4 s: kill -9 or drain an instance (restarted soon after), or
    pause Redis for up to 3 s (longer than a lease)."""
    assert redis.process is not None
    while time.monotonic() < until:
        await asyncio.sleep(rng.uniform(1, 4))
        action = rng.choice(["kill", "term", "pause"])
        findings.counts[f"fault:{action}"] += 1
        if action == "pause":
            redis.process.send_signal(signal.SIGSTOP)
            pause = rng.uniform(0.3, 3.0)
            await asyncio.sleep(pause)
            redis.process.send_signal(signal.SIGCONT)
            print(f"{time.strftime('%X')} redis paused {pause:.1f} s", flush=True)
            continue
        slot = rng.randrange(instances.count)
        held = instances.slots[slot]
        print(f"{time.strftime('%X')} {action} port {held[1].port if held else '-'}",
              flush=True)
        await instances.stop(slot, action)
        await asyncio.sleep(rng.uniform(0.2, 2.0))
        await instances.start(slot)


def _prompt(rng: random.Random) -> str:
    steps: list[dict[str, Any]] = []
    for _ in range(rng.randint(1, 4)):
        roll = rng.random()
        if roll < 0.5:
            steps.append({"say": "x" * rng.randint(10, 80),
                          "tool_calls": [call("read_document")]})
        elif roll < 0.8:
            steps.append({"tool_calls": [call("insert_text", text="more")]})
        else:
            steps.append({"tool_calls": [call("replace_document", text="new")]})
    steps.append({"say": "done " + "y" * rng.randint(0, 60)})
    return script(*steps, chunk_chars=3, delay_ms=rng.choice([0, 5, 20]))


@dataclass
class Tab:
    """One document's editor tab and what it was shown."""

    document_id: str
    rng: random.Random
    findings: Findings
    client_id: str = ""
    epoch: str | None = None
    last_seq: int = 0
    shown: dict[int, dict[str, Any]] = field(default_factory=dict)
    runs: int = 0
    current: str | None = None  # the run started and not yet seen finished
    answered: set[str] = field(default_factory=set)
    last_run: str | None = None
    stuck: bool = False
    prompt: str = ""
    where: int = 0
    silences: list[tuple[int, float]] = field(default_factory=list)
    answers: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.client_id = f"tab-{self.document_id}"

    def _take(self, event: dict[str, Any]) -> None:
        seq = event.get("seq")
        if not isinstance(seq, int):
            return
        if seq != self.last_seq + 1:
            self.findings.problem(f"{self.document_id}: shown seq {seq} after {self.last_seq}")
        self.last_seq = max(self.last_seq, seq)
        if seq in self.shown:
            self.findings.problem(f"{self.document_id}: seq {seq} shown twice")
        elif event.get("type") == "run.finished" and event.get("status") == "failed":
            error = event.get("error") or {}  # the summary counts it; this names it
            print(f"{time.strftime('%X')} {self.document_id}: run {event.get('run_id')} "
                  f"failed/{event.get('reason')}: {error.get('code')}: {error.get('message')}"
                  f" (seq {seq}, port {self.where})", flush=True)
        self.shown[seq] = event

    async def _start(self, ws: Any, stopping: asyncio.Event) -> None:
        self.runs += 1
        self.current = f"{self.document_id}-r{self.runs}"
        if stopping.is_set():  # the faults are over: the tab's last run
            self.last_run = self.current
        self.prompt = _prompt(self.rng)
        await ws.send(orjson.dumps({"type": "run.start", "id": f"start-{self.runs}",
                                    "run_id": self.current, "prompt": self.prompt,
                                    "tools": EDITOR_TOOLS}).decode())

    async def _restart_lost(self, ws: Any, active: dict[str, Any] | None) -> None:
        """A run.start sent as the connection broke may never have arrived: sent again
        (its run id makes it idempotent) unless the run is seen, going or ended."""
        current = self.current
        if current is None or (active is not None and active.get("run_id") == current):
            return
        if any(e.get("run_id") == current for e in self.shown.values()):
            return
        self.findings.counts["run.start sent again"] += 1
        await ws.send(orjson.dumps({"type": "run.start", "id": f"start-{self.runs}",
                                    "run_id": current, "prompt": self.prompt,
                                    "tools": EDITOR_TOOLS}).decode())

    async def _answer_calls(self, ws: Any, calls: list[dict[str, Any]]) -> None:
        for pending in calls:
            if pending.get("kind", "tool") == "approval":
                message = {"type": "approval", "id": f"ans-{pending['call_id']}",
                           "run_id": pending["run_id"], "call_id": pending["call_id"],
                           "decision": "approve"}
            elif pending.get("token"):
                message = {"type": "tool.result", "id": f"ans-{pending['call_id']}",
                           "run_id": pending["run_id"], "call_id": pending["call_id"],
                           "token": pending["token"], "output": {"text": "hello"}}
            else:
                continue
            self.answers[message["id"]] = message
            await ws.send(orjson.dumps(message).decode())

    async def session(self, proc: Proc, stopping: asyncio.Event) -> bool:
        """One connection; True when the tab is done: the run it started after the
        faults stopped has ended."""
        url = proc.url(f"/v1/documents/{self.document_id}/ws")
        self.where = proc.port
        async with websockets.connect(url, max_size=None) as ws:
            hello: dict[str, Any] = {"type": "hello", "protocol": 1, "client_id": self.client_id,
                                     "token": token("alice", ttl_s=7200)}
            if self.epoch is not None:
                hello["resume"] = {"epoch": self.epoch, "after_seq": self.last_seq}
            await ws.send(orjson.dumps(hello).decode())
            welcome = orjson.loads(await asyncio.wait_for(ws.recv(), 30))
            if welcome.get("type") != "welcome":
                raise ConnectionError(f"no welcome: {welcome}")
            active = welcome.get("active_run")
            if self.epoch is not None and not welcome["resumed"]:
                self.findings.problem(f"{self.document_id}: resume failed "
                                      f"({welcome.get('resume_failed')})")
                self.last_seq = welcome["last_seq"]  # rebuilt: what follows is checked
                if active is None:
                    self.current = None  # its end was not replayed
            self.epoch = welcome["epoch"]
            replay_until = welcome["last_seq"]
            pending = [] if active is None or active.get("client_id") != self.client_id \
                else [{**p, "run_id": active["run_id"]} for p in active.get("pending", [])]
            if self.last_seq >= replay_until:  # nothing replayed: answer what waits now
                await self._answer_calls(ws, pending)
                pending = []
                await self._restart_lost(ws, active)
            if active is None and self.current is None:
                await self._start(ws, stopping)
            while True:
                try:
                    event = orjson.loads(await asyncio.wait_for(ws.recv(), 60))
                except TimeoutError:
                    print(f"{self.document_id}: nothing for 60 s on port {proc.port} after "
                          f"seq {self.last_seq} (run {self.current}, {time.strftime('%X')})",
                          flush=True)
                    self.silences.append((self.last_seq, time.time() - 60))
                    raise
                self._take(event)
                kind = event.get("type")
                live = event.get("seq", replay_until + 1) > replay_until
                if event.get("seq") == replay_until:  # the replay is in: answer what waits
                    await self._answer_calls(ws, pending)
                    pending = []
                    await self._restart_lost(ws, active)
                if not live and not (kind == "run.finished" and
                                     event.get("run_id") == self.current):
                    continue  # a replayed call or approval is answered from active_run
                if kind == "tool.call" and event.get("client_id") == self.client_id and \
                        event["call_id"] not in self.answered:
                    self.answered.add(event["call_id"])
                    await asyncio.sleep(self.rng.uniform(0, 0.05))
                    await self._answer_calls(ws, [event])
                elif kind == "approval.requested":
                    await self._answer_calls(ws, [{**event, "kind": "approval"}])
                elif kind == "message.delta" and self.rng.random() < 0.01 and \
                        not stopping.is_set():
                    await ws.send(orjson.dumps({"type": "editor.change", "origin": "user",
                                                "summary": "typed"}).decode())
                    self.findings.counts["edit"] += 1
                elif kind == "error":
                    self.findings.counts[f"error:{event.get('code')}"] += 1
                    again = self.answers.get(str(event.get("reply_to")))
                    if again is not None and event.get("code") in ("unavailable",
                                                                   "rate_limited"):
                        await asyncio.sleep(event.get("retry_after_ms", 500) / 1000)
                        await ws.send(orjson.dumps(again).decode())  # as a client does
                    if event.get("reply_to") != f"start-{self.runs}":
                        continue  # not about the tab's latest run.start
                    if event.get("code") in ("unavailable", "rate_limited"):  # for a moment:
                        await asyncio.sleep(event.get("retry_after_ms", 500) / 1000)
                        self.runs -= 1  # sent again, under the same run id
                        await self._start(ws, stopping)
                    else:  # not retried (`document_busy`: another run is active): named
                        print(f"{time.strftime('%X')} {self.document_id}: run.start of "
                              f"{self.current} refused {event.get('code')}: "
                              f"{event.get('message')} (port {self.where})", flush=True)
                elif kind == "run.finished" and event.get("run_id") == self.current:
                    self.findings.counts[f"run:{event['status']}:{event.get('reason')}"] += 1
                    if self.current == self.last_run:
                        return True
                    self.current = None
                    await asyncio.sleep(self.rng.uniform(0, 0.3))
                    await self._start(ws, stopping)


async def tab_loop(tab: Tab, instances: Instances, stopping: asyncio.Event) -> None:
    while True:
        live = instances.live()
        if not live:
            await asyncio.sleep(0.2)
            continue
        try:
            if await tab.session(tab.rng.choice(live), stopping):
                return
        except (OSError, ConnectionError, TimeoutError, websockets.WebSocketException) as exc:
            tab.findings.counts[f"drop:{type(exc).__name__}"] += 1
            await asyncio.sleep(tab.rng.uniform(0.05, 0.5))


async def soak(seconds: float, count: int, documents: int, seed: int) -> Findings:
    rng = random.Random(seed)
    findings = Findings()
    async with redis_process() as redis:
        instances = Instances(redis, count)
        try:
            for slot in range(count):
                await instances.start(slot)
            stopping = asyncio.Event()
            tabs = [Tab(f"chaos-{seed}-{i}", random.Random(rng.random()), findings)
                    for i in range(documents)]
            loops = [asyncio.create_task(tab_loop(tab, instances, stopping)) for tab in tabs]
            await monkey(instances, redis, rng, time.monotonic() + seconds, findings)
            for slot in range(count):
                if instances.slots[slot] is None:
                    await instances.start(slot)
            stopping.set()
            _, stuck = await asyncio.wait(loops, timeout=FINISH_S)
            for tab, loop in zip(tabs, loops, strict=True):
                if loop in stuck:
                    tab.stuck = True
                    findings.problem(f"{tab.document_id}: no run ended within {FINISH_S:.0f} s "
                                     f"after the faults stopped (run {tab.current})")
                    loop.cancel()
            for tab in tabs:
                try:
                    await audit(tab, instances.live()[0])
                except (OSError, TimeoutError, websockets.WebSocketException) as exc:
                    findings.problem(f"{tab.document_id}: its log could not be read back: {exc} "
                                     f"({type(exc).__name__})")
        finally:
            await instances.close()
    return findings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--instances", type=int, default=3)
    parser.add_argument("--documents", type=int, default=12)
    parser.add_argument("--seed", type=int, default=int.from_bytes(os.urandom(2), "big"))
    args = parser.parse_args()
    print(f"chaos soak: seed {args.seed}, {args.seconds:.0f} s, {args.instances} instances, "
          f"{args.documents} documents", flush=True)
    findings = asyncio.run(soak(args.seconds, args.instances, args.documents, args.seed))
    for key, value in sorted(findings.counts.items()):
        print(f"  {key}: {value}")
    print(f"{len(findings.problems)} problems (seed {args.seed})")
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    sys.exit(1 if findings.problems else 0)


if __name__ == "__main__":
    main()
