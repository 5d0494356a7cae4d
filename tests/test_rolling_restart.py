"""A rolling restart of three instances with twenty runs in flight (PROTOCOL.md section
13, issue 12): each instance in turn gets a replacement, then SIGTERM; its runs are
handed over and its clients, closed with 1001, resume on a live instance and keep
answering tool calls. Real redis-server, real server processes, real sockets."""

import asyncio
import contextlib
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from websockets.exceptions import ConnectionClosed

from bench.common import Proc
from tests.cluster_support import hello, instance
from tests.harness import Client, ws_client
from tests.redis_support import redis_process
from tests.runs import EDITOR_TOOLS, call, script

pytestmark = [pytest.mark.redis, pytest.mark.slow]
RUNS, TOOL_STEPS = 20, 7
# A handoff does not wait for the lease (it gives it up at once); 2 s rather than the
# other tests' 1 s keeps a starved core from lapsing leases while instances start.
LEASE = {"COWRITE_RUN_LEASE_S": "2"}
# Calls 1, 3 and 5 of every run wait for the restarts 1, 2 and 3 to begin, call 6 for
# the last to end: every run is in flight through every restart, and answers cross each.
GATED = {1: 0, 3: 1, 5: 2, 6: 3}
STEPS = script(*({"say": f"step {k} ", "tool_calls": [call("read_document")]}
                 for k in range(TOOL_STEPS)), {"say": "all done"}, chunk_chars=3, delay_ms=30)


@dataclass
class Tab:
    """One user's tab on one document: it starts a run there and answers its tool calls
    the way static/client.js does (a result is kept until its tool.done and sent again
    after a reconnect, or after `retry_after_ms` when refused as `unavailable`; a
    pending call not yet answered is answered)."""

    index: int
    seqs: list[int] = field(default_factory=list)
    calls: Counter[str] = field(default_factory=Counter)
    order: list[str] = field(default_factory=list)  # call ids, first seen first
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    closes: list[int | None] = field(default_factory=list)
    finished: dict[str, Any] | None = None
    client: Client | None = None

    @property
    def run_id(self) -> str:
        return f"roll-{self.index}"

    @property
    def path(self) -> str:
        return f"/v1/documents/roll-doc-{self.index}/ws"


class Restart:
    """The instances that take connections, and the gates the restarts open."""

    def __init__(self, first: list[Proc]) -> None:
        self.live = list(first)
        self.gates = [asyncio.Event() for _ in range(len(GATED))]
        self.waiting = [asyncio.Event() for _ in range(RUNS)]  # at the first gate

    def pick(self, index: int) -> Proc:
        return self.live[index % len(self.live)]


async def drive(tab: Tab, restart: Restart, work: asyncio.TaskGroup) -> None:
    epoch: str | None = None
    started = False
    while tab.finished is None:
        proc = restart.pick(tab.index)
        client: Client | None = None
        with contextlib.suppress(ConnectionClosed, OSError):
            async with ws_client(proc.url(tab.path)) as client:
                resume = {"epoch": epoch, "after_seq": tab.seqs[-1] if tab.seqs else 0}
                await client.send(hello(f"tab-{tab.index}", f"user-{tab.index}",
                                        resume if epoch else None))
                welcome = orjson.loads(await client.ws.recv())
                assert welcome["type"] == "welcome", welcome
                assert epoch is None or welcome["resumed"] is True, welcome
                tab.events.append(welcome)
                epoch, tab.client = welcome["epoch"], client
                if not started:
                    await client.send({"type": "run.start", "run_id": tab.run_id,
                                       "prompt": STEPS, "tools": EDITOR_TOOLS})
                    started = True
                for item in (welcome.get("active_run") or {}).get("pending", ()):
                    if item["call_id"] in tab.results:  # answered; maybe never received
                        await client.send(tab.results[item["call_id"]])
                async for raw in client.ws:
                    handle(tab, orjson.loads(raw), restart, work)
        if client is not None:
            tab.closes.append(client.ws.close_code)
        if tab.finished is None:
            await asyncio.sleep(0.05)


def handle(tab: Tab, event: dict[str, Any], restart: Restart, work: asyncio.TaskGroup) -> None:
    tab.events.append(event)
    if "seq" in event:
        tab.seqs.append(event["seq"])
    kind = event.get("type")
    if kind == "tool.call" and event["run_id"] == tab.run_id:
        tab.calls[event["call_id"]] += 1
        if tab.calls[event["call_id"]] == 1:
            tab.order.append(event["call_id"])
            work.create_task(answer(tab, event, len(tab.order) - 1, restart))
    elif kind == "tool.done":
        tab.results.pop(event["call_id"], None)
    elif kind == "error" and event.get("code") == "unavailable":  # as static/client.js
        kept = [r for r in tab.results.values() if r["id"] == event.get("reply_to")]
        if kept:
            work.create_task(resend(tab, kept[0], event.get("retry_after_ms", 1000) / 1000))
    elif kind == "run.finished" and event["run_id"] == tab.run_id:
        tab.finished = event
        work.create_task(tab.client.close() if tab.client else asyncio.sleep(0))


async def answer(tab: Tab, tool_call: dict[str, Any], number: int, restart: Restart) -> None:
    gate = GATED.get(number)
    if gate is not None:
        if gate == 0:
            restart.waiting[tab.index].set()
        await restart.gates[gate].wait()
    await asyncio.sleep(random.uniform(0, 0.4))
    result = {"type": "tool.result", "id": f"result:{tool_call['call_id']}",
              "run_id": tab.run_id, "call_id": tool_call["call_id"],
              "token": tool_call["token"], "output": {"text": f"doc {tab.index}"}}
    tab.results[tool_call["call_id"]] = result
    await resend(tab, result, 0)


async def resend(tab: Tab, result: dict[str, Any], after_s: float) -> None:
    """Send `result` (again, after `after_s`) unless its tool.done came meanwhile."""
    await asyncio.sleep(after_s)
    if tab.client is not None and tab.results.get(result["call_id"]) is result:
        with contextlib.suppress(ConnectionClosed):
            await tab.client.send(result)


async def test_rolling_restart_with_twenty_runs_in_flight() -> None:
    tabs = [Tab(i) for i in range(RUNS)]
    async with redis_process() as redis, contextlib.AsyncExitStack() as stack:
        first = [await stack.enter_async_context(instance(redis, LEASE)) for _ in range(3)]
        restart = Restart(first)
        async with asyncio.timeout(180), asyncio.TaskGroup() as work:
            for tab in tabs:
                work.create_task(drive(tab, restart, work))
            await asyncio.gather(*(waiting.wait() for waiting in restart.waiting))
            for gate, old in zip(restart.gates, first, strict=False):
                restart.live.append(await stack.enter_async_context(instance(redis,
                                                                             LEASE)))
                gate.set()  # answers start flowing ...
                await asyncio.sleep(0.2)
                restart.live.remove(old)
                old.process.terminate()  # ... and the instance drains in the middle of them
                await asyncio.wait_for(old.process.wait(), 15)  # drained, then gone
            restart.gates[-1].set()
    for tab in tabs:
        errors = [e for e in tab.events if e.get("type") == "error"]
        assert tab.finished is not None and tab.finished["status"] == "completed", \
            (tab.finished, errors, tab.closes, tab.events[-12:])
        assert tab.seqs == list(range(1, len(tab.seqs) + 1)), tab.seqs  # none lost or twice
        assert len(tab.order) == TOOL_STEPS and set(tab.calls.values()) == {1}, tab.calls
        dones = [e for e in tab.events if e.get("type") == "tool.done"]
        assert [(d["call_id"], d["status"]) for d in dones] == [(c, "ok") for c in tab.order]
        assert 1001 in tab.closes and set(tab.closes) <= {1000, 1001}, tab.closes  # drained
        resumed = [e["reason"] for e in tab.events if e.get("type") == "run.resumed"]
        # Every run was handed over at least once. On a starved machine a lease can
        # still lapse before its renewal (then `owner_lost`): the story stays whole.
        assert "handoff" in resumed and set(resumed) <= {"handoff", "owner_lost"}, resumed
        assert len([e for e in tab.events if e.get("type") == "run.finished"]) == 1
