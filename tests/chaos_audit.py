"""The chaos soak's audit (`python -m tests.chaos`): once the faults have stopped,
every document's whole log, replayed to a fresh connection, is checked against the
rules, and against what its tab was shown across every reconnect. Apart from the soak
itself so that each stays readable; it knows a tab only by what it reads of one
(`Watched`), so it imports nothing of `tests.chaos`.
"""

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson
import websockets

from bench.common import Proc
from tests.harness import token

QUIET_FIELDS = ("seq", "ts", "token", "prompt", "delta", "text", "arguments", "output")


@dataclass
class Findings:
    """What the soak found: each problem is printed the moment it is found (a long soak
    shows it before the end), and counts of what happened, printed at the end."""

    problems: list[str] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)

    def problem(self, text: str) -> None:
        self.problems.append(text)
        print("PROBLEM:", text, flush=True)


class Watched(Protocol):
    """What the audit reads of a soak's tab (`tests.chaos.Tab`): its document, the
    epoch it last resumed in, what it was shown, where it went silent, whether it
    wedged; and where the findings go."""

    document_id: str
    findings: Findings
    epoch: str | None
    last_seq: int
    shown: dict[int, dict[str, Any]]
    silences: list[tuple[int, float]]
    stuck: bool
    where: int


async def audit(tab: Watched, proc: Proc) -> None:
    """The document's whole log, replayed to a fresh tab, against the rules."""
    url = proc.url(f"/v1/documents/{tab.document_id}/ws")
    events: list[dict[str, Any]] = []
    async with websockets.connect(url, max_size=None) as ws:
        await ws.send(orjson.dumps({"type": "hello", "protocol": 1, "client_id": "auditor",
                                    "token": token("alice", ttl_s=7200),
                                    "resume": {"epoch": tab.epoch, "after_seq": 0}}).decode())
        welcome = orjson.loads(await ws.recv())
        if not welcome.get("resumed"):
            raise ConnectionError(f"the log was not replayed ({welcome.get('resume_failed')})")
        final_active = welcome.get("active_run")
        while len(events) < welcome["last_seq"]:
            event = orjson.loads(await asyncio.wait_for(ws.recv(), 30))
            if "seq" in event:
                events.append(event)
    problem = tab.findings.problem
    name = tab.document_id
    if [e["seq"] for e in events] != list(range(1, len(events) + 1)):
        problem(f"{name}: the log's seqs are not 1..{len(events)}")
    started, finished, calls, done = Counter[str](), Counter[str](), Counter[str](), Counter[str]()
    for event in events:
        run_id, kind = str(event.get("run_id") or ""), event["type"]
        if run_id and finished[run_id] and kind != "document.changed":
            problem(f"{name}: {kind} (seq {event['seq']}) after {run_id} finished")
        if kind == "run.started":
            started[run_id] += 1
        elif kind == "run.finished":
            finished[run_id] += 1
        elif kind == "tool.call":
            calls[event["call_id"]] += 1
        elif kind == "tool.done":
            done[event["call_id"]] += 1
    lost_before_start = {e.get("run_id") for e in events if e["type"] == "run.finished"
                         and e.get("reason") == "server_lost"}
    broken = {str(e.get("run_id")) for e in events if e.get("run_id")
              and (started[str(e["run_id"])], finished[str(e["run_id"])]) not in ((1, 1), (0, 1))}
    for run_id in sorted(broken)[:3]:
        print(f"{name}: the events of {run_id}:")
        for event in events:
            if event.get("run_id") == run_id and event["type"] != "message.delta":
                brief = {k: v for k, v in event.items() if k not in QUIET_FIELDS}
                print(f"  {event['seq']} {time.strftime('%X', time.localtime(event['ts'] / 1000))}"
                      f".{event['ts'] % 1000:03d} {brief}"[:260])
    for run_id in set(started) | set(finished):
        if (started[run_id], finished[run_id]) == (0, 1) and run_id in lost_before_start:
            # its owner died after accepting it, before it began: no checkpoint to go on
            # from, so it ends aborted/server_lost, its only event (README)
            tab.findings.counts["run lost before it began"] += 1
            continue
        if (started[run_id], finished[run_id]) != (1, 1):
            problem(f"{name}: {run_id} started {started[run_id]}x, finished "
                    f"{finished[run_id]}x")
    for counter, what in ((calls, "asked"), (done, "done")):
        for call_id, times in counter.items():
            if times > 1:
                problem(f"{name}: call {call_id} {what} {times}x")
    logged = {e["seq"]: e for e in events}
    for seq, shown in tab.shown.items():
        if seq in logged and logged[seq] != shown:
            problem(f"{name}: seq {seq} shown as {shown['type']}, logged as "
                    f"{logged[seq]['type']}")
    for seq, since in tab.silences:  # what the log got while the tab heard nothing
        print(f"{name}: after seq {seq}, silent from "
              f"{time.strftime('%X', time.localtime(since))}:")
        for event in events[seq:seq + 8]:
            brief = {k: v for k, v in event.items() if k not in QUIET_FIELDS}
            print(f"  {event['seq']} +{event['ts'] / 1000 - since:.1f}s {brief}"[:260])
    if tab.stuck:
        print(f"{name}: active run at the end: {final_active}; the tab saw seq "
              f"{tab.last_seq}, last on port {tab.where}")
        for event in events[-12:]:
            print(f"  {event['seq']} {event['type']} "
                  f"{ {k: v for k, v in event.items() if k not in ('seq', 'ts', 'token')} }"[:300])
    tab.findings.counts["runs"] += len(started)
    tab.findings.counts["events"] += len(events)
