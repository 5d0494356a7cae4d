"""OpenTelemetry traces of runs (optional extra `otel`; off unless `COWRITE_OTEL=1`).

One span per run (`cowrite.run`), with a child per model call
(`cowrite.model_call`), per tool round trip (`cowrite.tool`, from `tool.call`
to `tool.done`) and per approval wait (`cowrite.approval`). Attributes carry
run, document, user and call ids, tool names and statuses; never tokens, and
never prompt text unless `COWRITE_OTEL_CAPTURE_TEXT=1`.

Everything is fed from the run driver's committed decisions through one hook
(`observe(input, decision)`), so tracing sees exactly what the run machine
decided and the machine stays pure. When tracing is off, `active` is None and
the hook is a single attribute test per decision: no import of the
OpenTelemetry SDK, no allocation. The module is process-wide (one tracer
provider per process, as OpenTelemetry itself has).

Why spans are not made with `Tracer.start_span`: an SDK span costs ~15 us of
CPU to start and end (context lookups, the sampler, a lock, attribute
validation through `BoundedAttributes`), and a client tool round trip makes
two of them: ~10% of the round trip's server CPU. Here an open span is three
slots (name, span id, start time) beside one attribute dict; when it ends it
becomes the SDK's `ReadableSpan` (what every exporter consumes) and goes to
the provider's span processors (`on_end`, as `Span.end` does), ~2.5 us in all.
What the SDK would still do is honoured: the provider's resource, id generator
and sampler (asked once per run, as `ParentBased` would: children follow the
run's decision; the standard `OTEL_TRACES_SAMPLER` variables configure it).
What it gives up: processors see spans only when they end (`on_start` and
`_on_ending` are not called; the SDK's batch and simple processors ignore
both), and attribute values are not checked (they are ids, names and
statuses: strings and ints set here, never user input but the opt-in prompt).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
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
    from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, Tracer, TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import SpanContext, Status

logger = logging.getLogger("cowrite.tracing")
_MODEL_ENDS = frozenset({ModelFinished, ModelUnparseable, ModelFailed, Crashed})


# A span not ended yet: (name, span id, start in ns since the epoch, attributes). A
# tuple, not a class: it is made twice per tool round trip.
_Open = tuple[str, int, int, dict[str, Any]]


@dataclass(slots=True)
class _RunSpans:
    run: _Open
    context: SpanContext  # the run span's: the parent of every child
    model: _Open | None = None
    tools: dict[str, _Open] = field(default_factory=dict)  # by call id
    approvals: dict[str, _Open] = field(default_factory=dict)


class RunTracer:
    """Turns a run's committed decisions into spans, handed to the span processor as
    they end. `processor`: the provider's only processor when `configure` built the
    provider (one call less per span than the provider's multi-processor)."""

    def __init__(self, tracer: Tracer, capture_text: bool,
                 processor: SpanProcessor | None = None) -> None:
        from opentelemetry.sdk.trace import ReadableSpan
        from opentelemetry.sdk.trace.sampling import Decision as Sampling
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope
        from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

        self._on_end = (processor or tracer.span_processor).on_end
        self._resource = tracer.resource
        self._sampler = tracer.sampler
        self._span_id = tracer.id_generator.generate_span_id
        self._trace_id = tracer.id_generator.generate_trace_id
        self._scope = InstrumentationScope("cowrite")
        self._readable = ReadableSpan
        self._span_context = SpanContext
        self._kind = SpanKind.INTERNAL
        self._unset = Status(StatusCode.UNSET)
        self._error = StatusCode.ERROR
        self._status = Status
        self._drop, self._sample = Sampling.DROP, Sampling.RECORD_AND_SAMPLE
        self._flags = {True: TraceFlags(TraceFlags.SAMPLED), False: TraceFlags(TraceFlags.DEFAULT)}
        self._capture_text = capture_text
        self._on_event: dict[type, Callable[[_RunSpans, Any], None]] = {
            ToolCall: self._tool_call, ToolDone: self._tool_done,
            ApprovalRequested: self._approval_requested,
            ApprovalResolved: self._approval_resolved, RunFinished: self._run_finished}
        self._runs: dict[str, _RunSpans] = {}

    # -- spans ------------------------------------------------------------------------
    def _open(self, name: str, attributes: dict[str, Any]) -> _Open:
        return name, self._span_id(), time.time_ns(), attributes

    def _close(self, spans: _RunSpans, span: _Open, status: Status | None = None) -> None:
        """End a child span now: one `ReadableSpan` to the processor (what `Span.end`
        does; arguments by position, in `ReadableSpan.__init__`'s order)."""
        name, span_id, start, attributes = span
        parent = spans.context
        self._on_end(self._readable(
            name, self._span_context(parent.trace_id, span_id, False, parent.trace_flags,
                                     parent.trace_state),
            parent, self._resource, attributes, (), (), self._kind, None,
            status or self._unset, start, time.time_ns(), self._scope))

    def _begin(self, decision: Decision) -> _RunSpans | None:
        state = decision.state
        attributes: dict[str, Any] = {
            "cowrite.run_id": state.run_id, "cowrite.document_id": state.document_id,
            "cowrite.user_id": state.user_id, "cowrite.mode": state.mode,
            "cowrite.model": state.model}
        if self._capture_text:
            attributes["cowrite.prompt"] = state.prompt
        trace_id = self._trace_id()
        sampled = self._sampler.should_sample(None, trace_id, "cowrite.run", self._kind,
                                              attributes)
        if sampled.decision is self._drop:
            return None
        if sampled.attributes:
            attributes.update(sampled.attributes)
        run = self._open("cowrite.run", attributes)
        context = self._span_context(trace_id, run[1], False,
                                     self._flags[sampled.decision is self._sample],
                                     sampled.trace_state)
        spans = self._runs[state.run_id] = _RunSpans(run, context)
        return spans

    # -- the hook ---------------------------------------------------------------------
    def observe(self, event: Input, decision: Decision) -> None:
        """Called for every committed decision of every run: dispatch on exact types
        (inputs, effects and events are final classes) so a decision costs a few
        dict lookups when it starts or ends nothing. A failure here is logged and
        costs the run its spans, never the run itself (the hook is the driver's)."""
        state = decision.state
        try:
            spans = self._runs.get(state.run_id)
            if spans is None:
                if type(event) is not Begin:
                    return
                spans = self._begin(decision)
                if spans is None:
                    return
            if spans.model is not None and type(event) in _MODEL_ENDS:
                self._close(spans, spans.model, self._status(self._error, event.error.code)
                            if isinstance(event, ModelFailed) else None)
                spans.model = None
            on_event = self._on_event
            for effect in decision.effects:
                kind = type(effect)
                if kind is Publish:
                    for published in effect.events:  # type: ignore[union-attr]
                        handler = on_event.get(type(published))
                        if handler is not None:
                            handler(spans, published)
                elif kind is CallModel:
                    if spans.model is not None:
                        self._close(spans, spans.model)
                    spans.model = self._open("cowrite.model_call", {
                        "cowrite.run_id": state.run_id, "cowrite.step": state.step})
            if state.finished:
                self._end(state.run_id, spans, state.status)
        except Exception:
            self._runs.pop(state.run_id, None)
            logger.exception("tracing failed on %s; the run's spans are dropped",
                             type(event).__name__, extra={"run_id": state.run_id})

    def _tool_call(self, spans: _RunSpans, event: ToolCall) -> None:
        spans.tools[event.call_id] = self._open("cowrite.tool", {
            "cowrite.run_id": event.run_id, "cowrite.call_id": event.call_id,
            "cowrite.tool": event.name, "cowrite.executor": event.executor})

    def _tool_done(self, spans: _RunSpans, event: ToolDone) -> None:
        span = spans.tools.pop(event.call_id, None)
        if span is not None:
            span[3]["cowrite.status"] = event.status
            self._close(spans, span)

    def _approval_requested(self, spans: _RunSpans, event: ApprovalRequested) -> None:
        spans.approvals[event.call_id] = self._open("cowrite.approval", {
            "cowrite.run_id": event.run_id, "cowrite.call_id": event.call_id,
            "cowrite.tool": event.name})

    def _approval_resolved(self, spans: _RunSpans, event: ApprovalResolved) -> None:
        span = spans.approvals.pop(event.call_id, None)
        if span is not None:
            span[3]["cowrite.decision"] = event.decision
            self._close(spans, span)

    def _run_finished(self, spans: _RunSpans, event: RunFinished) -> None:
        spans.run[3]["cowrite.status"] = event.status
        if event.reason:
            spans.run[3]["cowrite.reason"] = event.reason

    def _end(self, run_id: str, spans: _RunSpans, status: str) -> None:
        for span in (*spans.tools.values(), *spans.approvals.values(), spans.model):
            if span is not None:
                self._close(spans, span)
        name, _, start, attributes = spans.run
        attributes["cowrite.status"] = status
        self._on_end(self._readable(
            name, spans.context, None, self._resource, attributes, kind=self._kind,
            status=self._status(self._error, status) if status == "failed" else self._unset,
            start_time=start, end_time=time.time_ns(), instrumentation_scope=self._scope))
        del self._runs[run_id]


# The process's run tracer; None when tracing is off (the driver's hook tests it).
active: RunTracer | None = None
_provider_override: TracerProvider | None = None


def use_provider(provider: TracerProvider | None) -> None:
    """Tests (and embedders): the tracer provider `configure` uses instead of its own."""
    global _provider_override
    _provider_override = provider


def _dropping_exporter() -> SpanExporter:
    """`COWRITE_OTEL_EXPORTER=none`: an exporter that drops every span, behind the same
    batch processor the real exporters get, so the measured overhead is all but the
    export itself."""
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    class Dropping(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    return Dropping()


def _exporter(kind: str) -> SpanExporter:
    if kind == "none":
        return _dropping_exporter()
    if kind == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[import-not-found]
            OTLPSpanExporter,
        )
    except ImportError as exc:
        raise RuntimeError("COWRITE_OTEL_EXPORTER=otlp needs "
                           "opentelemetry-exporter-otlp-proto-http") from exc
    exporter: SpanExporter = OTLPSpanExporter()
    return exporter


def configure(settings: Settings) -> RunTracer | None:
    """Switch tracing on or off for this process, from the settings."""
    global active
    if not settings.otel:
        active = None
        return None
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import Tracer, TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise RuntimeError("COWRITE_OTEL=1 needs the otel extra: pip install "
                           "'cowrite[otel]'") from exc
    provider, processor = _provider_override, None
    if provider is None:
        provider = TracerProvider(resource=Resource.create({"service.name": "cowrite"}))
        processor = BatchSpanProcessor(_exporter(settings.otel_exporter))
        provider.add_span_processor(processor)
    tracer = provider.get_tracer("cowrite")
    if not isinstance(tracer, Tracer):  # OTEL_SDK_DISABLED=true: the SDK makes no spans
        logger.warning("COWRITE_OTEL=1 but OTEL_SDK_DISABLED is set: no traces")
        active = None
        return None
    active = RunTracer(tracer, settings.otel_capture_text, processor)
    return active
