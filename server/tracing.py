"""OpenTelemetry traces of runs (optional extra `otel`; off unless `COWRITE_OTEL=1`).

One span per run (`cowrite.run`), with a child per model call
(`cowrite.model_call`), per tool round trip (`cowrite.tool`, from `tool.call`
to `tool.done`) and per approval wait (`cowrite.approval`). Attributes carry
run, document, user and call ids, tool names and statuses; never tokens, and
never prompt text unless `COWRITE_OTEL_CAPTURE_TEXT=1`.

Everything is fed from the run driver's committed decisions through one hook
(`observe(input, decision)`), so tracing sees exactly what the run machine
decided and the machine stays pure. When tracing is off, `active` is None and
the hook is a single attribute test per decision: no import of OpenTelemetry,
no allocation. The module is process-wide (one tracer provider per process,
as OpenTelemetry itself has).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from protocol.server import ApprovalRequested, ApprovalResolved, RunFinished, ToolCall, ToolDone
from server.agent.steps import (
    Begin,
    CallModel,
    Crashed,
    Decision,
    Input,
    ModelFailed,
    ModelFinished,
    ModelUnparseable,
    Publish,
)
from server.settings import Settings

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

logger = logging.getLogger("cowrite.tracing")


@dataclass
class _RunSpans:
    run: Span
    model: Span | None = None
    children: dict[str, Span] = field(default_factory=dict)  # "tool:<id>", "approval:<id>"


class RunTracer:
    """Turns a run's committed decisions into spans."""

    def __init__(self, tracer: Tracer, capture_text: bool) -> None:
        from opentelemetry import trace

        self._trace = trace
        self._tracer = tracer
        self._capture_text = capture_text
        self._runs: dict[str, _RunSpans] = {}

    def _child(self, spans: _RunSpans, name: str, attributes: dict[str, Any]) -> Span:
        context = self._trace.set_span_in_context(spans.run)
        return self._tracer.start_span(name, context=context, attributes=attributes)

    def observe(self, event: Input, decision: Decision) -> None:
        state = decision.state
        spans = self._runs.get(state.run_id)
        if isinstance(event, Begin) and spans is None:
            attributes: dict[str, Any] = {
                "cowrite.run_id": state.run_id, "cowrite.document_id": state.document_id,
                "cowrite.user_id": state.user_id, "cowrite.mode": state.mode,
                "cowrite.model": state.model}
            if self._capture_text:
                attributes["cowrite.prompt"] = state.prompt
            spans = self._runs[state.run_id] = _RunSpans(
                self._tracer.start_span("cowrite.run", attributes=attributes))
        if spans is None:
            return
        if isinstance(event, (ModelFinished, ModelUnparseable, ModelFailed, Crashed)) and \
                spans.model is not None:
            if isinstance(event, ModelFailed):
                spans.model.set_status(self._trace.StatusCode.ERROR, event.error.code)
            spans.model.end()
            spans.model = None
        for effect in decision.effects:
            if isinstance(effect, CallModel):
                if spans.model is not None:
                    spans.model.end()
                spans.model = self._child(spans, "cowrite.model_call", {
                    "cowrite.run_id": state.run_id, "cowrite.step": state.step})
            elif isinstance(effect, Publish):
                self._published(spans, effect)
        if state.finished:
            self._end(state.run_id, spans, state.status)

    def _published(self, spans: _RunSpans, effect: Publish) -> None:
        for published in effect.events:
            if isinstance(published, ToolCall):
                spans.children[f"tool:{published.call_id}"] = self._child(spans, "cowrite.tool", {
                    "cowrite.run_id": published.run_id, "cowrite.call_id": published.call_id,
                    "cowrite.tool": published.name, "cowrite.executor": published.executor})
            elif isinstance(published, ApprovalRequested):
                spans.children[f"approval:{published.call_id}"] = self._child(
                    spans, "cowrite.approval", {
                        "cowrite.run_id": published.run_id, "cowrite.call_id": published.call_id,
                        "cowrite.tool": published.name})
            elif isinstance(published, ApprovalResolved):
                span = spans.children.pop(f"approval:{published.call_id}", None)
                if span is not None:
                    span.set_attribute("cowrite.decision", published.decision)
                    span.end()
            elif isinstance(published, ToolDone):
                span = spans.children.pop(f"tool:{published.call_id}", None)
                if span is not None:
                    span.set_attribute("cowrite.status", published.status)
                    span.end()
            elif isinstance(published, RunFinished):
                spans.run.set_attribute("cowrite.status", published.status)
                if published.reason:
                    spans.run.set_attribute("cowrite.reason", published.reason)

    def _end(self, run_id: str, spans: _RunSpans, status: str) -> None:
        for span in (*spans.children.values(), spans.model):
            if span is not None:
                span.end()
        spans.run.set_attribute("cowrite.status", status)
        if status == "failed":
            spans.run.set_status(self._trace.StatusCode.ERROR, status)
        spans.run.end()
        del self._runs[run_id]


# The process's run tracer; None when tracing is off (the driver's hook tests it).
active: RunTracer | None = None
_provider_override: TracerProvider | None = None


def use_provider(provider: TracerProvider | None) -> None:
    """Tests (and embedders): the tracer provider `configure` uses instead of its own."""
    global _provider_override
    _provider_override = provider


def configure(settings: Settings) -> RunTracer | None:
    """Switch tracing on or off for this process, from the settings."""
    global active
    if not settings.otel:
        active = None
        return None
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    except ImportError as exc:
        raise RuntimeError("COWRITE_OTEL=1 needs the otel extra: pip install "
                           "'cowrite[otel]'") from exc
    provider = _provider_override
    if provider is None:
        provider = TracerProvider(resource=Resource.create({"service.name": "cowrite"}))
        if settings.otel_exporter == "console":
            provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
        elif settings.otel_exporter == "otlp":
            try:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[import-not-found]
                    OTLPSpanExporter,
                )
            except ImportError as exc:
                raise RuntimeError("COWRITE_OTEL_EXPORTER=otlp needs "
                                   "opentelemetry-exporter-otlp-proto-http") from exc
            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        # "none": spans are made and dropped (to measure the overhead)
    active = RunTracer(provider.get_tracer("cowrite"), settings.otel_capture_text)
    return active
