"""The pure core, without sockets: protocol parsing, limits, the writer's seq
bookkeeping, the memory backend's log, call tokens."""

import asyncio
import time

import pytest

from protocol.client import Hello, RunStart, ToolResult
from protocol.codes import CloseCode, ErrorCode
from protocol.parsing import ParseFailure, parse_client_message
from protocol.server import RunFinished
from server.auth import Authenticator, CallGrant
from server.backends.memory import MemoryBackend
from server.limits import InvalidStreak, TokenBucket, UserBuckets
from server.outbound import CloseRequest, Outbound
from server.settings import Settings


def test_parse_valid_messages() -> None:
    hello = parse_client_message('{"type":"hello","protocol":1,"client_id":"t","id":"h"}')
    assert isinstance(hello, Hello) and hello.client_id == "t" and hello.id == "h"
    run = parse_client_message(
        '{"type":"run.start","prompt":"p","tools":[{"name":"read_document","parameters":{}}]}')
    assert isinstance(run, RunStart) and run.mode == "agent"
    assert run.tools[0].name == "read_document"
    result = parse_client_message(
        '{"type":"tool.result","run_id":"r","call_id":"c","token":"t","output":null}')
    assert isinstance(result, ToolResult) and result.output is None and result.error is None


@pytest.mark.parametrize(
    ("frame", "code", "loc"),
    [
        ("{", ErrorCode.INVALID_MESSAGE, None),
        ("3", ErrorCode.INVALID_MESSAGE, None),
        ('{"type":"nope"}', ErrorCode.UNKNOWN_TYPE, None),
        ('{"type":7}', ErrorCode.INVALID_MESSAGE, ["type"]),
        ('{"type":"hello","protocol":2,"client_id":"t"}', ErrorCode.INVALID_MESSAGE, ["protocol"]),
        ('{"type":"run.start","prompt":"p","tools":[{"name":"bad name!"}]}',
         ErrorCode.INVALID_MESSAGE, ["tools", 0, "name"]),
        ('{"type":"tool.result","run_id":"r","call_id":"c","token":"t","output":1,'
         '"error":{"message":"m"}}', ErrorCode.INVALID_MESSAGE, []),
        ('{"type":"ping","id":"' + "x" * 65 + '"}', ErrorCode.INVALID_MESSAGE, ["id"]),
        ('{"type":"approval","run_id":"r","call_id":"c","decision":"maybe"}',
         ErrorCode.INVALID_MESSAGE, ["decision"]),
    ],
)
def test_parse_failures_say_what_and_where(frame: str, code: ErrorCode, loc: list[object] | None
                                           ) -> None:
    failure = parse_client_message(frame)
    assert isinstance(failure, ParseFailure) and failure.code == code
    if loc is not None:
        assert failure.details and failure.details[0]["loc"] == loc


def test_duplicate_tool_names_are_refused() -> None:
    failure = parse_client_message(
        '{"type":"run.start","prompt":"p","tools":[{"name":"a"},{"name":"a"}]}')
    assert isinstance(failure, ParseFailure) and "unique" in failure.message


def test_server_events_omit_none_fields() -> None:
    wire = RunFinished(run_id="r", status="completed", steps=1).to_wire()
    assert wire == {"type": "run.finished", "run_id": "r", "status": "completed", "steps": 1}


def test_close_codes_say_whether_to_retry() -> None:
    assert CloseCode.SLOW_CONSUMER.retryable and CloseCode.GOING_AWAY.retryable
    assert not CloseCode.FORBIDDEN.retryable and not CloseCode.TOO_MANY_INVALID.retryable


def test_token_bucket_with_a_fake_clock() -> None:
    now = [0.0]
    bucket = TokenBucket(rate=2, burst=4, clock=lambda: now[0])
    assert [bucket.take() for _ in range(4)] == [0, 0, 0, 0]
    wait_ms = bucket.take()
    assert 400 <= wait_ms <= 600
    now[0] += 0.5
    assert bucket.take() == 0
    assert TokenBucket(rate=0, burst=0).take() == 0  # disabled


def test_a_rate_under_half_a_token_a_second_still_lets_requests_through() -> None:
    """COWRITE_RATE_MESSAGES_PER_S=0.4 made a burst of 0.8: no token ever came, and
    every request was refused for good with a `retry_after_ms` that lied."""
    now = [0.0]
    bucket = TokenBucket(rate=0.4, burst=0.8, clock=lambda: now[0])
    assert bucket.take() == 0
    wait_ms = bucket.take()
    assert 2400 <= wait_ms <= 2600
    now[0] += wait_ms / 1000
    assert bucket.take() == 0


def test_user_buckets_are_per_user_and_bounded() -> None:
    now = [0.0]
    buckets = UserBuckets(rate=1, burst=2, kept=2, clock=lambda: now[0])
    assert [buckets.take("ann") for _ in range(2)] == [0, 0] and buckets.take("ann") > 0
    assert buckets.take("bob") == 0  # bob's own bucket
    assert buckets.take("cat") == 0  # a third user: ann, heard from longest ago, forgotten
    assert buckets.take("ann") == 0  # ann starts again with a full bucket
    assert buckets.take("cat") == 0 and buckets.take("cat") > 0  # cat was kept
    now[0] += 1.0
    assert buckets.take("cat") == 0


def test_invalid_streak() -> None:
    streak = InvalidStreak(3)
    assert not streak.record_invalid() and not streak.record_invalid()
    streak.record_valid()
    assert [streak.record_invalid() for _ in range(3)] == [False, False, True]
    assert not InvalidStreak(0).record_invalid()


async def test_memory_log_numbering_and_reads() -> None:
    backend = MemoryBackend(log_max_events=3)
    seen: list[int] = []
    await backend.subscribe("d", lambda event: seen.append(event.seq))
    for i in range(5):
        await backend.append("d", {"type": "document.changed", "n": i})
    epoch, last = await backend.head("d")
    assert last == 5 and seen == [1, 2, 3, 4, 5]
    events = await backend.read_after("d", epoch, 2)
    assert isinstance(events, list) and [e.seq for e in events] == [3, 4, 5]
    assert await backend.read_after("d", epoch, 1) == "history_truncated"
    assert await backend.read_after("d", epoch, 6) == "history_truncated"
    assert await backend.read_after("d", "other", 4) == "epoch_changed"
    assert await backend.read_after("d", epoch, 5) == []
    assert (await backend.head("e")).epoch != epoch  # every log has its own epoch


async def test_outbound_sends_each_seq_once_in_order_and_fills_gaps() -> None:
    backend = MemoryBackend()
    logged = [await backend.append("d", {"type": "document.changed"}) for _ in range(6)]
    epoch = (await backend.head("d")).epoch
    sent: list[str] = []

    async def send(text: str) -> None:
        sent.append(text)

    async def backfill(after: int, until: int) -> object:
        return await backend.read_after("d", epoch, after, until)

    out = Outbound(send, max_events=100, backfill=backfill)  # type: ignore[arg-type]
    out.push_event(logged[3])  # arrives before `begin`: held
    out.begin(None, 1, [logged[1]])  # replay seq 2; then the held 4 reveals a gap (3)
    out.push_event(logged[1])  # duplicate
    out.push_event(logged[4])
    out.close(CloseRequest(1000, "bye"))
    assert await asyncio.wait_for(out.run(), 2) == CloseRequest(1000, "bye")
    assert [int(t.split('"seq":')[1].split(",")[0]) for t in sent] == [2, 3, 4, 5]


async def test_outbound_overflow_requests_4009_and_drops_queue() -> None:
    async def send(_: str) -> None:
        await asyncio.sleep(0)

    async def backfill(after: int, until: int) -> None:
        return None

    backend = MemoryBackend()
    out = Outbound(send, max_events=16, backfill=backfill)
    out.begin(None, 0, [])
    for _ in range(17):
        out.push_event(await backend.append("d", {"type": "document.changed"}))
    assert out.close_request is not None and out.close_request.code == 4009
    assert (await out.run()).code == 4009


def test_call_tokens_are_bound_and_expire() -> None:
    auth = Authenticator(Settings(jwt_secret="s" * 32))
    now = int(time.time() * 1000)
    grant = CallGrant("run", "call", "alice", "doc", now + 1000)
    issued = auth.issue_call_token(grant)
    assert auth.check_call_token(issued, grant, now) is None
    other = CallGrant("run", "call", "bob", "doc", now + 1000)
    assert "another" in (auth.check_call_token(issued, other, now) or "")
    assert "expired" in (auth.check_call_token(issued, grant, now + 2000) or "")
    assert "signature" in (auth.check_call_token(issued[:-2] + "AA", grant, now) or "")
    assert auth.check_call_token("garbage", grant, now) is not None
    # a client JWT secret alone never verifies a call token from another key
    stranger = Authenticator(Settings(jwt_secret="t" * 32))
    assert stranger.check_call_token(issued, grant, now) is not None


def test_production_settings_require_a_key() -> None:
    with pytest.raises(ValueError, match="COWRITE_JWT_SECRET"):
        Authenticator(Settings())
