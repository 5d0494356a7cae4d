"""The publish side's fast paths give what the general code gave: an in-process log's
plain-call appends (`MemoryBackend.append_encoded`) log the same events as
`Backend.append`; a text frame built by hand has websockets' bytes; `to_wire`
is `model_dump`; the per-frame counters scrape as `Counter.inc` would."""

import re
from typing import Any

import pytest
from prometheus_client import generate_latest
from websockets.protocol import State
from websockets.server import ServerProtocol

from protocol.base import WireModel
from protocol.server import (
    DocumentChanged,
    RunError,
    RunFinished,
    RunScopeChanged,
    ScopeSpan,
    ToolCall,
    ToolDone,
)
from server.app import build_services
from server.backends.base import LoggedEvent, UnloggableEvent
from server.observability import Metrics
from server.wsprotocol import append_text_frame
from tests.harness import make_settings

EVENTS = [
    ToolDone(run_id="r", call_id="c1", status="ok", output={"text": "é\u2028", "n": [1, 2.5]}),
    ToolCall(run_id="r", call_id="c2", name="read", arguments={"a": {"b": None}},
             executor="client", client_id="x"),
    RunFinished(run_id="r", status="completed", steps=3),
]


def test_to_wire_is_model_dump() -> None:
    models: list[WireModel] = [
        *EVENTS, DocumentChanged(user_id="u", client_id="c", origin="user"),
        ToolDone(run_id="r", call_id="c", status="ok", output={"a": None, 1: (1, 2), "b": b"x"}),
        RunFinished(run_id="r", status="failed", steps=1, usage={"t": 1.5},
                    error=RunError(code="x", message="y", details=None)),
        RunScopeChanged(run_id="r", scope=[ScopeSpan(**{"from": 1}, to=2)], user_id="u"),
    ]
    for model in models:
        wire = model.to_wire()
        assert list(wire.items()) == list(
            model.model_dump(mode="json", exclude_none=True, by_alias=True).items())
    assert models[-1].to_wire()["scope"] == [{"from": 1, "to": 2}]


def _without_ts(event: LoggedEvent) -> tuple[int, str, str]:
    return event.seq, event.type, re.sub(r',"ts":\d+}$', "}", event.frame)


async def _logged(fast: bool, groups: list[list[Any]], delta: str | None = None
                  ) -> tuple[list[tuple[int, str, str]], list[str]]:
    """Publish `groups` to a fresh document (after a held delta, if any); what the log
    holds and what each group raised."""
    session = build_services(make_settings()).hub.get("doc")
    if not fast:
        session._append_encoded = None  # the general path: `backend.append`, awaited
    seen: list[LoggedEvent] = []
    await session.backend.subscribe("doc", seen.append)
    if delta is not None:
        session._last_delta_at = 1e18  # "hot": the delta is held for merging
        await session.publish_delta("r", "m", delta)
        assert session._pending is not None
    raised = []
    for group in groups:
        try:
            await session.publish_many(group)
            raised.append("")
        except UnloggableEvent:
            raised.append("unloggable")
    for task in list(session._flush_tasks):
        task.cancel()
    head = await session.backend.head("doc")
    logged = await session.backend.read_after("doc", head.epoch, 0)
    assert isinstance(logged, list) and logged == seen
    return [_without_ts(event) for event in logged], raised


def _nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth):
        value = {"a": value}
    return value


async def test_in_process_appends_log_what_backend_append_logs() -> None:
    deep = ToolDone(run_id="r", call_id="c3", status="ok", output=_nested(300))
    huge = ToolDone(run_id="r", call_id="c4", status="ok", output=2**70)
    groups: list[list[Any]] = [EVENTS[:1], EVENTS, [EVENTS[0], deep], [huge], [],
              [DocumentChanged(user_id="u", client_id="c", origin="user")]]
    for delta in (None, "held text"):
        fast = await _logged(True, groups, delta)
        general = await _logged(False, groups, delta)
        assert fast == general
        assert fast[1] == ["", "", "unloggable", "unloggable", "", ""]
        assert len(fast[0]) == 5 + (delta is not None)


def test_a_text_frame_has_websockets_bytes() -> None:
    for size in (0, 1, 125, 126, 127, 65535, 65536, 70000):
        data = ("é" * size).encode()[:size]
        general, fast = ServerProtocol(), ServerProtocol()
        general.state = fast.state = State.OPEN
        general.send_text(data)
        append_text_frame(fast, data)
        assert fast.data_to_send() == general.data_to_send(), size
    closing = ServerProtocol()
    closing.state = State.CLOSING
    with pytest.raises(Exception, match="closing"):
        append_text_frame(closing, b"x")  # what send_text raises, nothing written
    assert closing.data_to_send() == []


def _exposition(metrics: Metrics) -> str:
    text = generate_latest(metrics.registry).decode()
    return re.sub(r"(_created(\{[^}]*\})?) \S+", r"\1 T", text)


def test_counts_scrape_as_counter_inc_would() -> None:
    tallied, direct = Metrics(), Metrics()
    sent = ["tool.done", "ack", "tool.call", "ack", "welcome"]
    received = ["tool.result", "ping", "tool.result"]
    for rounds in range(3):
        for kind in sent:
            tallied.count_sent(kind)
            direct.messages_out.labels(kind).inc()
        for kind in received:
            tallied.count_received(kind)
            direct.messages_in.labels(kind).inc()
        tallied.messages_in.labels("hello").inc()  # counted at once elsewhere
        direct.messages_in.labels("hello").inc()
        assert _exposition(tallied) == _exposition(direct), rounds
    assert tallied.registry.get_sample_value("cowrite_messages_out_total",
                                             {"type": "ack"}) == 6.0
