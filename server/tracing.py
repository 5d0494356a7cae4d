"""OpenTelemetry traces of runs (optional extra `otel`; off unless `COWRITE_OTEL=1`).

One span per run (`cowrite.run`), with a child per model call
(`cowrite.model_call`), per tool round trip (`cowrite.tool`, from `tool.call`
to `tool.done`) and per approval wait (`cowrite.approval`). Attributes carry
run, document, user and call ids, tool names and statuses; never tokens, and
never prompt text unless `COWRITE_OTEL_CAPTURE_TEXT=1`. An approval span's
`cowrite.outcome` says how the wait ended: `approve` or `reject` (also in
`cowrite.decision`), `timeout`, `cancelled` (the run ended while it waited; the
run span's `cowrite.status` and `cowrite.reason` say how), or `moved`.

Everything is fed from the run driver's committed decisions through one hook
(`observe(input, decision)`), so tracing sees exactly what the run machine
decided and the machine stays pure. When tracing is off, `active` is None and
the hook is a single attribute test per decision: no import of the
OpenTelemetry SDK, no allocation. The module is process-wide (one tracer
provider per process, as OpenTelemetry itself has).

Why spans are not made with `Tracer.start_span`: an SDK span costs ~15 us of
CPU to start and end (context lookups, the sampler, a lock, attribute
validation through `BoundedAttributes`), and a client tool round trip makes
two of them. Here a decision only notes what it opens (a name, a clock
reading, one attribute dict) and what it ends (a `Record` of strings and ints,
`server.tracing_export`); ended spans are handed on in batches (64, or when a
run ends) and become the SDK's `ReadableSpan`s (what every exporter consumes)
only then: in a batch the SDK's code stays in the CPU's caches, and records
do not burden the garbage collector. With cowrite's own provider they go to
`SpanBatcher`, which makes them into `ReadableSpan`s in its thread right
before exporting; with a provider given to `use_provider`, to its span
processors (`on_end`, as `Span.end` does). What the SDK would do is honoured:
the provider's resource, id generator and sampler (asked once per run, as
`ParentBased` would: children follow the run's decision; the standard
`OTEL_TRACES_SAMPLER` variables configure it). A run's trace id is a hash of its
document and run ids (with the SDK's random id generator), so a run taken over by
another instance goes on in the same trace: a second `cowrite.run` span (with
`cowrite.resumed`) beside the one that ended `moved` there, and the same sampling
decision for a ratio sampler. What it gives up: processors
see spans only when they end (`on_start` and `_on_ending` are not called; the
SDK's batch and simple processors ignore both), and attribute values are not
checked (they are ids, names and statuses: strings and ints set here, never
user input but the opt-in prompt).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from protocol.server import ApprovalRequested, ApprovalResolved, RunFinished, ToolCall, ToolDone
from server.agent.steps import (
    Begin,
    CallModel,
    Crashed,
    Decision,
    Input,
    LeaseLost,
    ModelFailed,
    ModelFinished,
    ModelUnparseable,
    Publish,
    Resume,
)
from server.agent.wire_events import WireEvent
from server.settings import Settings
from server.startup_errors import StartupError

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import Tracer, TracerProvider
    from opentelemetry.trace import TraceState

    from server.tracing_export import Record, SpanBatcher

logger = logging.getLogger("cowrite.tracing")
_MODEL_ENDS = frozenset({ModelFinished, ModelUnparseable, ModelFailed, Crashed})


# A span not ended yet: (name, start in ns since the epoch, attributes). A tuple, not a
# class: two are made per tool round trip.
_Open = tuple[str, int, dict[str, Any]]
FLUSH_AT = 64  # ended spans kept before they are handed on (and whenever a run ends)


@dataclass(slots=True)
class _RunSpans:
    run: _Open
    trace_id: int
    span_id: int  # the run span's: the parent of every child
    sampled: bool
    trace_state: TraceState | None  # the sampler's, when it gave one
    model: _Open | None = None
    tools: dict[str, _Open] = field(default_factory=dict)  # by call id
    approvals: dict[str, _Open] = field(default_factory=dict)


class RunTracer:
    """Turns a run's committed decisions into span records, handed to `deliver` in
    batches (`FLUSH_AT` ended spans, or a run's end: a span is delivered no later
    than its run's end)."""

    def __init__(self, tracer: Tracer, capture_text: bool,
                 deliver: Callable[[list[Record]], None],
                 batcher: SpanBatcher | None = None) -> None:
        from opentelemetry.sdk.trace.sampling import Decision as Sampling
        from opentelemetry.trace import SpanKind

        self._deliver, self.batcher = deliver, batcher
        self._sampler = tracer.sampler
        from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

        self._span_id = tracer.id_generator.generate_span_id
        self._trace_id = tracer.id_generator.generate_trace_id
        # The SDK's own random ids: a run's trace id is then its ids' hash, the same on
        # every instance it runs on (a takeover goes on in the run's trace). A provider
        # with an id generator of its own (X-Ray's carries a time) keeps its ids.
        self._shared_trace = type(tracer.id_generator) is RandomIdGenerator
        self._kind = SpanKind.INTERNAL
        self._drop, self._sample = Sampling.DROP, Sampling.RECORD_AND_SAMPLE
        self._capture_text = capture_text
        self._on_event: dict[type, Callable[[_RunSpans, Any], None]] = {
            ToolCall: self._tool_call, ToolDone: self._tool_done,
            ApprovalRequested: self._approval_requested,
            ApprovalResolved: self._approval_resolved, RunFinished: self._run_finished}
        self._runs: dict[str, _RunSpans] = {}
        self._ended: list[Record] = []

    # -- spans ------------------------------------------------------------------------
    def _close(self, spans: _RunSpans, span: _Open, error: str | None = None) -> None:
        """End a child span now; it is handed on at the next flush."""
        name, start, attributes = span
        ended = self._ended
        ended.append((name, start, time.time_ns(), attributes, spans.trace_id, 0,
                      spans.span_id, spans.sampled, error, spans.trace_state))
        if len(ended) >= FLUSH_AT:
            self.flush()

    def flush(self) -> None:
        """Hand every ended span on."""
        ended, self._ended = self._ended, []
        if ended:
            self._deliver(ended)

    def _begin(self, decision: Decision, event: Input) -> _RunSpans | None:
        state = decision.state
        attributes: dict[str, Any] = {
            "cowrite.run_id": state.run_id, "cowrite.document_id": state.document_id,
            "cowrite.user_id": state.user_id, "cowrite.mode": state.mode,
            "cowrite.model": state.model}
        if isinstance(event, Resume):  # the run began on another instance
            attributes["cowrite.resumed"] = event.reason
        if self._capture_text:
            attributes["cowrite.prompt"] = state.prompt
        trace_id = run_trace_id(state.document_id, state.run_id) if self._shared_trace \
            else self._trace_id()
        sampled = self._sampler.should_sample(None, trace_id, "cowrite.run", self._kind,
                                              attributes)
        if sampled.decision is self._drop:
            return None
        if sampled.attributes:
            attributes.update(sampled.attributes)
        spans = self._runs[state.run_id] = _RunSpans(
            ("cowrite.run", time.time_ns(), attributes), trace_id, self._span_id(),
            sampled.decision is self._sample, sampled.trace_state or None)
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
                if type(event) is not Begin and type(event) is not Resume:
                    return  # a run taken over from another instance is traced from here
                spans = self._begin(decision, event)
                if spans is None:
                    return
            if spans.model is not None and type(event) in _MODEL_ENDS:
                self._close(spans, spans.model,
                            event.error.code if isinstance(event, ModelFailed) else None)
                spans.model = None
            on_event = self._on_event
            for effect in decision.effects:
                kind = type(effect)
                if kind is Publish:
                    for published in effect.events:  # type: ignore[union-attr]
                        handler = on_event.get(published.model if type(published) is WireEvent
                                               else type(published))
                        if handler is not None:
                            handler(spans, published)
                elif kind is CallModel:
                    if spans.model is not None:
                        self._close(spans, spans.model)
                    spans.model = ("cowrite.model_call", time.time_ns(), {
                        "cowrite.run_id": state.run_id, "cowrite.step": state.step})
            if state.finished:  # or it moved to another instance, which goes on with it
                self._end(state.run_id, spans,
                          "moved" if type(event) is LeaseLost else state.status)
        except Exception:
            self._runs.pop(state.run_id, None)
            logger.exception("tracing failed on %s; the run's spans are dropped",
                             type(event).__name__, extra={"run_id": state.run_id})

    def _tool_call(self, spans: _RunSpans, event: ToolCall) -> None:
        spans.tools[event.call_id] = ("cowrite.tool", time.time_ns(), {
            "cowrite.run_id": event.run_id, "cowrite.call_id": event.call_id,
            "cowrite.tool": event.name, "cowrite.executor": event.executor})

    def _tool_done(self, spans: _RunSpans, event: ToolDone) -> None:
        span = spans.tools.pop(event.call_id, None)
        if span is not None:
            span[2]["cowrite.status"] = event.status
            self._close(spans, span)
            return
        span = spans.approvals.pop(event.call_id, None)  # ended unanswered: `timeout`, or
        if span is not None:  # `cancelled` by the run's end (the run span says why)
            span[2]["cowrite.outcome"] = event.status
            self._close(spans, span)

    def _approval_requested(self, spans: _RunSpans, event: ApprovalRequested) -> None:
        spans.approvals[event.call_id] = ("cowrite.approval", time.time_ns(), {
            "cowrite.run_id": event.run_id, "cowrite.call_id": event.call_id,
            "cowrite.tool": event.name})

    def _approval_resolved(self, spans: _RunSpans, event: ApprovalResolved) -> None:
        span = spans.approvals.pop(event.call_id, None)
        if span is not None:
            span[2]["cowrite.decision"] = span[2]["cowrite.outcome"] = event.decision
            self._close(spans, span)

    def _run_finished(self, spans: _RunSpans, event: RunFinished) -> None:
        spans.run[2]["cowrite.status"] = event.status
        if event.reason:
            spans.run[2]["cowrite.reason"] = event.reason

    def _end(self, run_id: str, spans: _RunSpans, status: str) -> None:
        for approval in spans.approvals.values():  # no tool.done for it (the run moved)
            approval[2].setdefault("cowrite.outcome", status)
        for span in (*spans.tools.values(), *spans.approvals.values(), spans.model):
            if span is not None:
                self._close(spans, span)
        name, start, attributes = spans.run
        attributes["cowrite.status"] = status
        self._ended.append((name, start, time.time_ns(), attributes, spans.trace_id,
                            spans.span_id, 0, spans.sampled,
                            status if status == "failed" else None, spans.trace_state))
        del self._runs[run_id]
        self.flush()

    def shutdown(self) -> None:
        """Hand on what ended; stop cowrite's exporting thread, if it has one."""
        self.flush()
        if self.batcher is not None:
            self.batcher.shutdown()


def run_trace_id(document_id: str, run_id: str) -> int:
    """The trace id of a run's spans on every instance: 128 bits of a hash of its ids
    (random enough for a sampler's ratio; a run id is unique per document)."""
    digest = hashlib.blake2b(f"{document_id}\0{run_id}".encode(), digest_size=16).digest()
    return int.from_bytes(digest, "big") or 1  # 0 is the invalid trace id


# The process's run tracer; None when tracing is off (the driver's hook tests it).
active: RunTracer | None = None
_provider_override: TracerProvider | None = None


def use_provider(provider: TracerProvider | None) -> None:
    """Tests (and embedders): the tracer provider `configure` uses instead of its own;
    its span processors get each span (`on_end`) by the end of the span's run."""
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
        from opentelemetry.sdk.trace import Tracer, TracerProvider
    except ImportError as exc:
        raise StartupError("COWRITE_OTEL=1 needs the otel extra: pip install "
                           "'cowrite[otel]' (or set COWRITE_OTEL=0)") from exc
    if active is not None:  # a new app in the same process (tests): one exporting thread
        active.shutdown()
        active = None
    from server.tracing_export import Converter, SpanBatcher, exporter

    provider = _provider_override
    if provider is None:
        provider = TracerProvider(resource=Resource.create({"service.name": "cowrite"}))
    tracer = provider.get_tracer("cowrite")
    if not isinstance(tracer, Tracer):  # OTEL_SDK_DISABLED=true: the SDK makes no spans
        logger.warning("COWRITE_OTEL=1 but OTEL_SDK_DISABLED is set: no traces")
        return None
    convert = Converter(tracer.resource, tracer.id_generator)
    batcher = None
    if _provider_override is None:
        batcher = SpanBatcher(exporter(settings.otel_exporter), convert)
        deliver = batcher.add
    else:
        on_end = tracer.span_processor.on_end

        def deliver(records: list[Record]) -> None:
            for span in convert(records):
                on_end(span)

    active = RunTracer(tracer, settings.otel_capture_text, deliver, batcher)
    return active
