"""OpenTelemetry traces (COWRITE_OTEL=1): a run span whose children are its model
calls, tool round trips and approval waits, with ids and no tokens or text."""

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from server import tracing
from tests.harness import joined, running_server
from tests.runs import answer, call, script, start


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    tracing.use_provider(provider)
    try:
        yield spans
    finally:
        tracing.use_provider(None)
        tracing.active = None


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


async def test_no_spans_when_tracing_is_off(exporter: InMemorySpanExporter) -> None:
    async with running_server() as srv, joined(srv) as (client, _):
        await start(client, script({"say": "hi"}))
        await client.recv_until("run.finished")
    assert tracing.active is None
    assert exporter.get_finished_spans() == ()
