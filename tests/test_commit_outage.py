"""A Redis outage longer than half a lease while a run's decision is being written,
with real redis-server (taken away by a proxy at the decision's own write) and real
server processes.

The write holds the lease's lock (one write of the lease at a time); when it failed,
the run was ended (`Crashed`) still inside that lock, and ending it writes again under
the same lock, which is not re-entrant: the run hung for ever. No `run.finished`,
the document stayed busy, and SIGTERM never stopped the server (its shutdown waits
for the run). The same on a takeover whose `run.resumed` met the outage, which
besides opened the run's trace spans after the run had ended (never closed).

Then the run ended `failed` `internal_error` once half a lease had passed, which the
chaos soak (`tests/chaos.py`: Redis paused 2-3 s under a 2 s lease) showed about once
a soak: nobody else can take the run while Redis is away, so the decision is now
retried through the outage, fenced by the lease, as the run's end is
(`server/agent/commit.py`), and the run goes on."""

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
import redis.asyncio as aioredis
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from bench.common import Proc, server_process
from server import tracing
from tests.cluster_support import FAST_LEASE, ended, instance, join, killed, start_run
from tests.harness import SECRET, Client, joined, running_server
from tests.kill_proxy import _Proxy
from tests.redis_support import redis_process
from tests.runs import answer, call, script
from tests.test_outage_gaps import OutageProxy

pytestmark = [pytest.mark.redis, pytest.mark.slow]
TOOL_CALL = b'"type":"tool.call"'
RESUMED = b'"type":"run.resumed"'
# Lease 2 s: the decision's write is retried for half a lease (1 s), then through the
# outage (3 s in all) for up to 3 leases: Redis is back before that.

STEPS_CAP = {"COWRITE_MAX_STEPS": "100"}
ENV = {"COWRITE_RUN_LEASE_S": "2", "COWRITE_TOOL_TIMEOUT_S": "60",
       "COWRITE_CLIENT_GRACE_S": "60", **STEPS_CAP}
OUTAGE_S = 3.0
ENDED_WITHIN_S = 20.0  # the outage and the retries (7 s at most) on a loaded machine
STOPPED_WITHIN_S = 20.0
STEPS = script({"say": "Reading the document first. ", "tool_calls": [call("read_document")]},
               {"say": "done"}, delay_ms=20)


def reply_to(message_id: str) -> Any:
    return lambda e: e.get("reply_to") == message_id


async def finished_within(client: Client, run_id: str, timeout: float = ENDED_WITHIN_S
                          ) -> dict[str, Any]:
    try:
        async with asyncio.timeout(timeout):
            return await client.recv_until(ended(run_id), timeout=timeout)
    except TimeoutError:
        pytest.fail(f"no run.finished within {timeout} s of the outage (the run hangs); "
                    f"got {[e.get('type') for e in client.events]}")


async def start_when_free(client: Client, timeout: float = 10) -> dict[str, Any]:
    """Another `run.start` on the document, sent again while it is busy; its ack."""
    loop = asyncio.get_running_loop()
    deadline, attempt = loop.time() + timeout, 0
    while True:
        attempt += 1
        await client.send({"type": "run.start", "id": f"n{attempt}", "run_id": f"n-{attempt}",
                           "prompt": script({"say": "mine"}), "tools": []})
        reply = await client.recv_until(reply_to(f"n{attempt}"))
        if reply["type"] == "ack" or loop.time() > deadline:
            assert reply["type"] == "ack", f"the document stayed busy: {reply}"
            return reply
        assert reply["code"] in ("document_busy", "unavailable"), reply
        await asyncio.sleep(0.5)


async def stopped_by_sigterm(proc: Proc) -> float:
    """SIGTERM; how long the server took to exit (it must, well within the bound)."""
    began = time.monotonic()
    proc.process.terminate()
    try:
        async with asyncio.timeout(STOPPED_WITHIN_S):
            await proc.process.wait()
    except TimeoutError:
        pytest.fail(f"SIGTERM did not stop the server within {STOPPED_WITHIN_S} s")
    return time.monotonic() - began


async def logged(port: int, document_id: str = "doc-1") -> list[dict[str, Any]]:
    async with aioredis.Redis(port=port, decode_responses=True) as admin:
        entries: Any = await admin.xrange(f"cw:{{{document_id}}}:log")
        return [orjson.loads(fields["f"]) for _id, fields in entries]


async def busy(port: int, document_id: str = "doc-1") -> bool:
    async with aioredis.Redis(port=port) as admin:
        return bool(await admin.exists(f"cw:{{{document_id}}}:active"))


async def test_a_decision_written_through_an_outage_longer_than_half_a_lease_goes_on(
        ) -> None:
    """The model asks for a tool as Redis goes away for longer than half a lease (3 s, a
    2 s lease), as the chaos soak's Redis pauses do: once Redis is back, the `tool.call`
    is logged once, the tab answers it and the run completes. It used to end `failed`
    `internal_error` ("internal error (ref ...)", with no log line for the ref) after
    half a lease, though no other instance could have taken the run while Redis was
    away. The document then takes a new run, and SIGTERM stops the server at once."""
    async with redis_process() as redis, \
            OutageProxy(redis.port, TOOL_CALL, outage_s=OUTAGE_S, forward=False) as proxy, \
            server_process("cowrite", COWRITE_REDIS_URL=proxy.url, COWRITE_JWT_SECRET=SECRET,
                           **ENV) as owner:
        async with join(owner) as (alice, _):
            proxy.armed = True
            await start_run(alice, STEPS, "o-1")
            await asyncio.wait_for(proxy.fired.wait(), 10)
            tool_call = await alice.recv_until(lambda e: e.get("run_id") == "o-1" and e.get(
                "type") in ("tool.call", "run.finished"), timeout=ENDED_WITHIN_S)
            assert tool_call["type"] == "tool.call", f"the run ended instead: {tool_call}"
            await answer(alice, tool_call, {"text": "hello"})
            finished = await finished_within(alice, "o-1")
            assert (finished["status"], finished.get("reason")) == ("completed", None), finished
            async with join(owner, sub="bob", client_id="other") as (bob, _):
                ack = await start_when_free(bob)
                done = await bob.recv_until(ended(ack["run_id"]), timeout=10)
                assert done["status"] == "completed", done
        took = await stopped_by_sigterm(owner)
        assert took < 5, took
        entries = await logged(redis.port)
    of_o1 = [e["type"] for e in entries if e.get("run_id") == "o-1"
             and e["type"] in ("tool.call", "tool.done", "run.finished")]
    assert of_o1 == ["tool.call", "tool.done", "run.finished"], of_o1


async def test_sigterm_during_the_outage_hands_the_run_over_once_redis_is_back() -> None:
    """SIGTERM while the run's decision waits out the outage: the server cannot ask Redis
    which instances live, so it hands the run over (README, "On SIGTERM"): once Redis is
    back the decision is logged (its `tool.call`, once), the run is left to the next
    instance, and the server exits (it used to ignore SIGTERM for ever: only kill -9
    stopped it; then, until the decision was retried through the outage, the run ended
    `failed` `internal_error`). The next instance takes the run over with its call
    pending; the tab answers it there and the run completes."""
    async with redis_process() as redis, \
            OutageProxy(redis.port, TOOL_CALL, outage_s=OUTAGE_S, forward=False) as proxy:
        async with server_process("cowrite", COWRITE_REDIS_URL=proxy.url,
                                  COWRITE_JWT_SECRET=SECRET, **ENV) as owner:
            async with join(owner) as (alice, _):
                proxy.armed = True
                await start_run(alice, STEPS, "o-2")
                await asyncio.wait_for(proxy.fired.wait(), 10)
                await asyncio.sleep(1.5)  # half a lease: the decision waits out the outage
                assert proxy.down
                took = await stopped_by_sigterm(owner)
            assert took < OUTAGE_S + 2 * 2 + 5, took  # Redis back, a lease at most, slack
        entries = await logged(redis.port)
        assert [e["type"] for e in entries if e.get("run_id") == "o-2" and e["type"] in (
            "tool.call", "run.finished")] == ["tool.call"], "the decision was not logged once"
        async with instance(redis, ENV) as successor:
            for _ in range(100):  # it takes the orphaned run over as it starts
                async with join(successor) as (alice, welcome):
                    active = welcome.get("active_run")
                    if active is not None and active["run_id"] == "o-2":
                        [pending] = active["pending"]
                        await answer(alice, {**pending, "run_id": "o-2"}, {"text": "hello"})
                        finished = await finished_within(alice, "o-2")
                        assert finished["status"] == "completed", finished
                        return
                await asyncio.sleep(0.1)
            pytest.fail(f"the next instance did not take the run over: {welcome}")


class BlockingProxy(_Proxy):
    """While `blocking`, every command holding the marker is cut unforwarded (its
    connection closed, as an outage does); everything else reaches Redis: the run's
    decision waits out an "outage" that the rest of the instance does not see."""

    def __init__(self, redis_port: int, marker: bytes) -> None:
        super().__init__(redis_port, marker)
        self.blocking = True

    async def __aenter__(self) -> "BlockingProxy":
        await super().__aenter__()
        return self

    async def _up(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter,
                  cut: asyncio.Event) -> None:
        while data := await source.read(65536):
            if self.blocking and self.marker in data:
                self.fired.set()
                break
            sink.write(data)
            await sink.drain()
        sink.transport.abort()


async def test_an_edit_while_the_decision_waits_out_the_outage_is_refused_not_lost() -> None:
    """A person edits while the run's decision (its `tool.call`) waits out an outage that
    lookups do not meet (Redis answers them): the edit is refused `unavailable` before
    anything is done, and sent again once the decision is logged it aborts the run, as
    an edit does. The lookup used to find the run here and let the edit through
    unseen by the run: acked and logged, the run went on as if nobody had typed."""
    async with redis_process() as redis, BlockingProxy(redis.port, TOOL_CALL) as proxy, \
            server_process("cowrite", COWRITE_REDIS_URL=proxy.url, COWRITE_JWT_SECRET=SECRET,
                           **ENV) as owner:
        async with join(owner) as (alice, _):
            await start_run(alice, STEPS, "o-3")
            await asyncio.wait_for(proxy.fired.wait(), 10)
            # Past half a lease and redis-py's own retries: the decision waits out the
            # outage (for 3 leases more). An edit sent before waits behind it, in order.
            await asyncio.sleep(3.5)
            edit = {"type": "editor.change", "id": "e-1", "origin": "user", "summary": "typed"}
            await alice.send(edit)
            first = await alice.recv_until(reply_to("e-1"))
            assert (first["type"], first.get("code")) == ("error", "unavailable"), first
            proxy.blocking = False
            for _ in range(40):  # as a client does: again under the same id
                await asyncio.sleep(first.get("retry_after_ms", 250) / 1000)
                await alice.send(edit)
                reply = await alice.recv_until(reply_to("e-1"))
                if reply["type"] == "ack":
                    break
                assert reply.get("code") == "unavailable", reply
            else:
                pytest.fail("the edit sent again was never taken")
            finished = await finished_within(alice, "o-3")
        assert (finished["status"], finished.get("reason")) == \
            ("aborted", "document_changed"), finished


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    spans = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "cowrite-test"}))
    provider.add_span_processor(SimpleSpanProcessor(spans))
    tracing.use_provider(provider)
    try:
        yield spans
    finally:
        tracing.use_provider(None)
        tracing.active = None


def open_runs() -> set[str]:
    """The runs whose spans the tracer holds open (never exported until they end)."""
    assert tracing.active is not None
    return set(tracing.active._runs)


async def test_a_takeover_whose_resume_meets_the_outage_goes_on_traced_once(
        exporter: InMemorySpanExporter) -> None:
    """The owner dies with a call pending; the survivor takes the run over, and Redis
    goes away as it logs `run.resumed`, for longer than half a lease: once Redis is back
    the `run.resumed` is logged and the run goes on there (it ended `failed`
    `internal_error`; before that it hung): its executor's tab answers the call on the
    survivor and the run completes. The survivor's tracer then holds no span open for it
    and exported its run span once (a `Resume` traced after the run had ended opened
    spans nothing closed)."""
    async with redis_process() as redis, \
            OutageProxy(redis.port, RESUMED, outage_s=2.0, forward=False) as proxy, \
            running_server(redis_url=proxy.url, run_lease_s=1.0, otel=True,
                           tool_timeout_s=60, client_grace_s=60) as survivor:
        async with instance(redis, {**FAST_LEASE, **STEPS_CAP}) as owner, \
                joined(survivor, sub="bob", client_id="b") as (bob, _):
            async with join(owner, client_id="a") as (alice, _):
                proxy.armed = True
                await start_run(alice, script({"tool_calls": [call("read_document")]},
                                              {"say": "x"}), "t-1")
                await alice.recv_until("tool.call")
                await killed(owner)
            await asyncio.wait_for(proxy.fired.wait(), 15)  # taken over: its resume
            resumed = await bob.recv_until(lambda e: e.get("run_id") == "t-1" and e.get(
                "type") in ("run.resumed", "run.finished"), timeout=ENDED_WITHIN_S)
            assert resumed["type"] == "run.resumed", f"the run ended instead: {resumed}"
            async with joined(survivor, sub="alice", client_id="a") as (alice, welcome):
                [pending] = welcome["active_run"]["pending"]
                await answer(alice, {**pending, "run_id": "t-1"}, {"text": "hello"})
                finished = await finished_within(alice, "t-1")
            assert finished["status"] == "completed", finished
            runs = await run_spans(exporter, "t-1")
            assert "t-1" not in open_runs()
        entries = await logged(redis.port)
    assert [s.attributes and s.attributes["cowrite.run_id"] for s in runs] == ["t-1"]
    assert [e["type"] for e in entries if e.get("run_id") == "t-1" and e["type"] in (
        "run.resumed", "run.finished")] == ["run.resumed", "run.finished"]


async def run_spans(exporter: InMemorySpanExporter, last_run_id: str
                    ) -> list[ReadableSpan]:
    """The exported run spans, once the one of `last_run_id` is (it ends after its
    `run.finished` is logged)."""
    for _ in range(200):
        runs = [s for s in exporter.get_finished_spans() if s.name == "cowrite.run"]
        if any(s.attributes and s.attributes["cowrite.run_id"] == last_run_id for s in runs):
            return runs
        await asyncio.sleep(0.05)
    pytest.fail(f"the span of run {last_run_id} was not exported")
