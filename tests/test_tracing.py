"""OpenTelemetry traces (COWRITE_OTEL=1): a run span whose children are its model
calls, tool round trips and approval waits, with ids and no tokens or text."""

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import StatusCode

from server import tracing, tracing_export
from server.agent.driver import RunDriver
from server.agent.machine import RunMachine
from server.agent.run_state import RunState
from server.agent.steps import (
    Begin,
    Cancel,
    Decision,
    LeaseLost,
    MachineConfig,
    Publish,
    Resume,
)
from server.auth import Authenticator
from server.tracing_export import Converter, SpanBatcher
from tests.harness import joined, make_settings, running_server
from tests.runs import answer, call, script, start


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


def _machine() -> RunMachine:
    return RunMachine(MachineConfig(signer=Authenticator(make_settings()), tool_timeout_s=60,
                                    approval_timeout_s=60, run_timeout_s=600,
                                    client_grace_s=30))


def _named(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


async def test_a_run_is_one_trace_with_model_tool_and_approval_children(
        exporter: InMemorySpanExporter) -> None:
    prompt = script({"say": "Reading. ", "tool_calls": [call("read_document")]},
                    {"tool_calls": [call("replace_document", text="new")]},
                    {"say": "Done."})
    async with running_server(otel=True) as srv, joined(srv) as (client, _):
        ack = await start(client, prompt)
        await answer(client, await client.recv_until("tool.call"), {"text": "old"})
        requested = await client.recv_until("approval.requested")
        await client.send({"type": "approval", "run_id": ack["run_id"],
                           "call_id": requested["call_id"], "decision": "approve"})
        await answer(client, await client.recv_until("tool.call"), {"ok": True})
        await client.recv_until("run.finished")
    spans = exporter.get_finished_spans()
    (run,) = _named(spans, "cowrite.run")
    assert run.attributes is not None and run.parent is None
    assert run.attributes["cowrite.run_id"] == ack["run_id"]
    assert run.attributes["cowrite.document_id"] == "doc-1"
    assert run.attributes["cowrite.status"] == "completed"
    assert "cowrite.prompt" not in run.attributes
    models = _named(spans, "cowrite.model_call")
    tools = _named(spans, "cowrite.tool")
    approvals = _named(spans, "cowrite.approval")
    assert (len(models), len(tools), len(approvals)) == (3, 2, 1)
    for child in (*models, *tools, *approvals):
        assert child.parent is not None and child.parent.span_id == run.context.span_id
        assert child.context.trace_id == run.context.trace_id
    assert [t.attributes["cowrite.tool"] for t in tools if t.attributes] == [
        "read_document", "replace_document"]
    assert approvals[0].attributes is not None
    assert approvals[0].attributes["cowrite.decision"] == "approve"
    for span in spans:
        values = " ".join(str(v) for v in (span.attributes or {}).values())
        assert "token" not in " ".join(span.attributes or {}) and "Reading" not in values
        assert span.resource.attributes["service.name"] == "cowrite-test"  # the provider's
    # A trace viewer draws each child inside its run, in the order things happened.
    assert run.start_time is not None and run.end_time is not None
    for child in (*models, *tools, *approvals):
        assert child.start_time is not None and child.end_time is not None
        assert run.start_time <= child.start_time <= child.end_time <= run.end_time
    assert models[0].start_time <= tools[0].start_time <= models[1].start_time  # type: ignore[operator]
    assert tools[0].end_time <= models[1].start_time  # type: ignore[operator]


async def test_no_spans_when_tracing_is_off(exporter: InMemorySpanExporter) -> None:
    async with running_server() as srv, joined(srv) as (client, _):
        await start(client, script({"say": "hi"}))
        await client.recv_until("run.finished")
    assert tracing.active is None
    assert exporter.get_finished_spans() == ()


async def test_a_failed_model_call_marks_its_span_and_the_run_as_errors(
        exporter: InMemorySpanExporter) -> None:
    async with running_server(otel=True, otel_capture_text=True) as srv, \
            joined(srv) as (client, _):
        prompt = script({"fail": "the upstream is down"})
        ack = await start(client, prompt)
        finished = await client.recv_until("run.finished")
    assert finished["status"] == "failed"
    spans = exporter.get_finished_spans()
    (run,) = _named(spans, "cowrite.run")
    (model,) = _named(spans, "cowrite.model_call")
    assert run.attributes is not None and run.attributes["cowrite.run_id"] == ack["run_id"]
    assert run.attributes["cowrite.status"] == "failed"
    assert run.attributes["cowrite.prompt"] == prompt  # COWRITE_OTEL_CAPTURE_TEXT=1
    assert run.status.status_code is StatusCode.ERROR
    assert model.status.status_code is StatusCode.ERROR
    assert model.status.description == finished["error"]["code"] == "upstream_error"


async def test_a_run_whose_driver_fails_still_ends_its_spans(
        exporter: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver's last resort ends such a run `failed`; its spans stayed open in the
    tracer for ever, never exported."""
    execute = RunDriver._execute

    async def failing(self: RunDriver, decision: Decision, peer: Any) -> bool:
        if any(isinstance(e, Publish) and any(p.type == "tool.done" for p in e.events)
               for e in decision.effects):
            raise RuntimeError("a bug in the driver")
        return await execute(self, decision, peer)

    monkeypatch.setattr(RunDriver, "_execute", failing)
    async with running_server(otel=True) as srv, joined(srv) as (client, _):
        ack = await start(client, script({"tool_calls": [call("read_document")]},
                                         {"say": "never"}))
        await answer(client, await client.recv_until("tool.call"), {"text": "x"})
        finished = await client.recv_until("run.finished")
    assert (finished["status"], finished["reason"]) == ("failed", "internal_error")
    spans = exporter.get_finished_spans()
    (run,) = _named(spans, "cowrite.run")
    assert run.attributes is not None and run.attributes["cowrite.run_id"] == ack["run_id"]
    assert run.attributes["cowrite.status"] == "failed"
    assert run.status.status_code is StatusCode.ERROR
    assert len(_named(spans, "cowrite.tool")) == 1  # the open tool span ended with it
    assert tracing.active is not None and not tracing.active._runs


def test_a_run_that_moves_ends_its_spans_here_and_is_traced_where_it_goes_on(
        exporter: InMemorySpanExporter) -> None:
    """A run handed to another instance (its lease lost here, `Resume` there) ended no
    span on the instance it left and opened none on the one that took it over; now
    both end theirs, in one trace (it was two traces: nothing tied them together)."""
    tracer = tracing.configure(make_settings(otel=True))
    assert tracer is not None
    machine = _machine()
    state = RunState(run_id="r-moved", document_id="d", mode="agent", user_id="u",
                     client_id="c", prompt="p", model="m", max_steps=5)
    for event in (Begin(0, "start"), LeaseLost()):
        decision = machine.decide(state, event)
        tracer.observe(event, decision)
        state = decision.state
    (left,) = _named(exporter.get_finished_spans(), "cowrite.run")
    assert left.attributes is not None and left.attributes["cowrite.status"] == "moved"
    assert left.status.status_code is StatusCode.UNSET
    exporter.clear()
    tracer = tracing.configure(make_settings(otel=True))  # the instance that takes it over
    assert tracer is not None
    taken = RunState(run_id="r-moved", document_id="d", mode="agent", user_id="u",
                     client_id="c", prompt="p", model="m", max_steps=5, phase="model",
                     status="running", step=1, message_id="r-moved:m1")
    resume = Resume("owner_lost", 0, False, False)
    decision = machine.decide(taken, resume)
    tracer.observe(resume, decision)
    decision = machine.decide(decision.state, Cancel("u", "c"))
    tracer.observe(Cancel("u", "c"), decision)
    (resumed,) = _named(exporter.get_finished_spans(), "cowrite.run")
    assert resumed.attributes is not None
    assert resumed.attributes["cowrite.resumed"] == "owner_lost"
    assert resumed.attributes["cowrite.status"] == "cancelled"
    assert left.context is not None and resumed.context is not None
    assert resumed.context.trace_id == left.context.trace_id
    assert resumed.context.span_id != left.context.span_id
    assert left.context.trace_id == tracing.run_trace_id("d", "r-moved") != \
        tracing.run_trace_id("d2", "r-moved")


def test_a_providers_own_id_generator_keeps_making_the_trace_ids() -> None:
    """An operator's id generator (X-Ray's carries a time) is not replaced by the
    hash: each run span gets its ids from it."""
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class Counting(RandomIdGenerator):
        def generate_trace_id(self) -> int:
            return 42

    spans = InMemorySpanExporter()
    provider = TracerProvider(id_generator=Counting())
    provider.add_span_processor(SimpleSpanProcessor(spans))
    tracing.use_provider(provider)
    try:
        tracer = tracing.configure(make_settings(otel=True))
        assert tracer is not None
        machine = _machine()
        state = RunState(run_id="r-own", document_id="d", mode="agent", user_id="u",
                         client_id="c", prompt="p", model="m", max_steps=5)
        for event in (Begin(0, "start"), Cancel("u", "c")):
            decision = machine.decide(state, event)
            tracer.observe(event, decision)
            state = decision.state
        (run,) = _named(spans.get_finished_spans(), "cowrite.run")
        assert run.context is not None and run.context.trace_id == 42
    finally:
        tracing.use_provider(None)
        tracing.active = None


async def test_the_providers_sampler_decides_per_run(exporter: InMemorySpanExporter) -> None:
    """OTEL_TRACES_SAMPLER (here the provider's sampler) is asked once per run: a run
    it drops makes no spans at all, and the run itself is unaffected."""
    provider = TracerProvider(sampler=ALWAYS_OFF)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use_provider(provider)
    async with running_server(otel=True) as srv, joined(srv) as (client, _):
        await start(client, script({"tool_calls": [call("read_document")]}, {"say": "ok"}))
        await answer(client, await client.recv_until("tool.call"), {"text": "doc"})
        finished = await client.recv_until("run.finished")
    assert finished["status"] == "completed"
    assert exporter.get_finished_spans() == ()


async def test_without_a_provider_spans_go_through_cowrites_exporting_thread(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Without `use_provider`, ended spans go to cowrite's exporting thread, which makes
    them into ReadableSpans of cowrite's resource and exports them by shutdown."""
    exported = InMemorySpanExporter()
    kinds: list[str] = []

    def exporter(kind: str) -> InMemorySpanExporter:
        kinds.append(kind)
        return exported

    monkeypatch.setattr(tracing_export, "exporter", exporter)
    try:
        async with running_server(otel=True, otel_exporter="console") as srv, \
                joined(srv) as (client, _):
            ack = await start(client, script({"tool_calls": [call("read_document")]},
                                             {"say": "ok"}))
            await answer(client, await client.recv_until("tool.call"), {"text": "doc"})
            assert (await client.recv_until("run.finished"))["status"] == "completed"
            assert tracing.active is not None
            tracing.active.shutdown()  # what happens at exit: export what is waiting
    finally:
        tracing.active = None
    assert kinds == ["console"]
    spans = exported.get_finished_spans()
    assert sorted(s.name for s in spans) == [
        "cowrite.model_call", "cowrite.model_call", "cowrite.run", "cowrite.tool"]
    (run,) = _named(spans, "cowrite.run")
    assert run.attributes is not None and run.attributes["cowrite.run_id"] == ack["run_id"]
    assert run.parent is None and run.resource.attributes["service.name"] == "cowrite"
    for child in spans:
        if child is not run:
            assert child.parent is not None and child.parent.span_id == run.context.span_id
            assert child.context.trace_id == run.context.trace_id


def test_the_exporting_thread_drops_unsampled_spans_and_exports_the_rest() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    batcher = SpanBatcher(exporter, Converter(provider.resource, provider.id_generator))
    models = [("cowrite.model_call", i, i + 1, {"cowrite.step": i}, 7, 0, 9, True, None, None)
              for i in range(150)]  # more than one conversion chunk
    batcher.add([("cowrite.tool", 10, 20, {"cowrite.status": "ok"}, 7, 0, 9, True, None, None),
                 *models,
                 ("cowrite.run", 5, 30, {}, 7, 9, 0, True, "failed", None),
                 ("cowrite.run", 5, 30, {}, 8, 11, 0, False, None, None)])
    batcher.shutdown()
    tool, *steps, run = exporter.get_finished_spans()
    assert [s.attributes["cowrite.step"] for s in steps if s.attributes] == list(range(150))
    assert len({s.context.span_id for s in (tool, *steps, run)}) == 152
    assert (tool.name, tool.start_time, tool.end_time) == ("cowrite.tool", 10, 20)
    assert tool.parent is not None and tool.parent.span_id == 9 == run.context.span_id
    assert tool.context.trace_id == run.context.trace_id == 7 and run.parent is None
    assert run.status.status_code is StatusCode.ERROR and run.status.description == "failed"
    assert tool.status.status_code is StatusCode.UNSET


def test_spans_are_exported_within_otel_bsp_schedule_delay(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """A quiet server still exports what ended, after the schedule delay (the SDK's
    variable; 5 s by default), not only when 512 spans wait."""
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    batcher = SpanBatcher(exporter, Converter(provider.resource, provider.id_generator))
    try:
        batcher.add([("cowrite.run", 5, 30, {}, 7, 9, 0, True, None, None)])
        deadline = time.monotonic() + 3  # well inside the default 5 s
        while not exporter.get_finished_spans() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [span.name for span in exporter.get_finished_spans()] == ["cowrite.run"]
    finally:
        batcher.shutdown()


APPROVE_THEN_SAY = script({"tool_calls": [call("replace_document", text="new")]},
                          {"say": "Done."})


@pytest.mark.parametrize("ending", ["cancelled", "timed_out"])
async def test_an_approval_wait_the_run_ended_says_how_it_ended(
        exporter: InMemorySpanExporter, ending: str) -> None:
    """An approval span closed by the run's end (cancelled, or the approval timed out)
    said nothing about its outcome: no decision, no status."""
    overrides: dict[str, Any] = {"approval_timeout_s": 0.2} if ending == "timed_out" else {}
    async with running_server(otel=True, **overrides) as srv, joined(srv) as (client, _):
        ack = await start(client, APPROVE_THEN_SAY)
        await client.recv_until("approval.requested")
        if ending == "cancelled":
            await client.send({"type": "run.cancel", "run_id": ack["run_id"]})
        finished = await client.recv_until("run.finished")
    assert finished["status"] == ending
    spans = exporter.get_finished_spans()
    (approval,) = _named(spans, "cowrite.approval")
    assert approval.attributes is not None
    assert approval.attributes["cowrite.outcome"] == (
        "cancelled" if ending == "cancelled" else "timeout")
    assert "cowrite.decision" not in approval.attributes
    (run,) = _named(spans, "cowrite.run")
    assert run.attributes is not None and run.attributes["cowrite.status"] == ending


async def test_an_answered_approval_has_its_decision_as_outcome(
        exporter: InMemorySpanExporter) -> None:
    async with running_server(otel=True) as srv, joined(srv) as (client, _):
        ack = await start(client, APPROVE_THEN_SAY)
        requested = await client.recv_until("approval.requested")
        await client.send({"type": "approval", "run_id": ack["run_id"],
                           "call_id": requested["call_id"], "decision": "reject"})
        await client.recv_until("run.finished")
    (approval,) = _named(exporter.get_finished_spans(), "cowrite.approval")
    assert approval.attributes is not None
    assert approval.attributes["cowrite.decision"] == approval.attributes["cowrite.outcome"] \
        == "reject"


class _Unreachable(InMemorySpanExporter):
    """An exporter whose endpoint never answers: export blocks until shutdown ends it
    (the OTLP exporter's retries, which its shutdown interrupts)."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.stopped = threading.Event()

    def export(self, spans: Any) -> Any:
        self.entered.set()
        self.stopped.wait(30)
        return super().export(spans)

    def shutdown(self) -> None:
        self.stopped.set()
        super().shutdown()


def test_shutdown_gives_up_on_an_exporter_that_does_not_answer(
        caplog: pytest.LogCaptureFixture) -> None:
    """With the OTLP endpoint down, shutdown (SIGTERM) waited 10 s for the exporting
    thread; it waits about two and says, in one line, how many spans it dropped."""
    exporter = _Unreachable()
    provider = TracerProvider()
    batcher = SpanBatcher(exporter, Converter(provider.resource, provider.id_generator))
    batcher.add([("cowrite.run", 5, 30, {}, 7, 9, 0, True, None, None)] * 600)  # wakes it
    assert exporter.entered.wait(5)
    batcher.add([("cowrite.run", 5, 30, {}, 8, 11, 0, True, None, None)] * 3)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="cowrite.tracing"):
        batcher.shutdown()
    took = time.monotonic() - started
    assert 1.5 < took < 4, took
    lines = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert lines == ["tracing: the span exporter did not finish within 2 s at shutdown; "
                     "603 spans were dropped"]
    batcher._thread.join(5)
    assert not batcher._thread.is_alive(), "no batch is exported after the one in flight"
