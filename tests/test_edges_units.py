"""Issue 11 ("nothing lost at the edges") without sockets: the log's numbering,
eviction, the writer's bounds, retries and token filtering, edge checks."""

import asyncio
import logging
import time
from typing import Any

import jwt
import orjson
import pytest

from protocol.codes import ErrorCode
from protocol.jsonlimits import has_out_of_range_int, nesting_over
from protocol.parsing import ParseFailure, decode_frame
from server.auth import Authenticator, AuthError, CallGrant, call_token_user
from server.backends.base import BackendUnavailable, LoggedEvent, UnloggableEvent
from server.backends.memory import MemoryBackend
from server.limits import HandshakeGate
from server.observability import TextFormatter
from server.outbound import CloseRequest, Outbound
from server.settings import Settings

SECRET = "unit-secret-0123456789abcdef0123456789"


def nested(depth: int, leaf: Any = 1) -> Any:
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


def seq_of(frame: str) -> int:
    return int(orjson.loads(frame)["seq"])


# -- the log: a seq only for an event that is already serialized ---------------------------
@pytest.mark.parametrize("bad", [nested(260), 2**64, {1, 2}], ids=["deep", "int65", "set"])
async def test_unloggable_event_takes_no_seq_and_leaves_no_trace(bad: Any) -> None:
    backend = MemoryBackend()
    seen: list[LoggedEvent] = []
    await backend.subscribe("d", seen.append)
    await backend.append("d", {"type": "document.changed"})
    with pytest.raises(UnloggableEvent):
        await backend.append("d", {"type": "tool.done", "output": bad})
    assert (await backend.head("d")).last_seq == 1
    after = await backend.append("d", {"type": "document.changed"})
    assert after.seq == 2 and [e.seq for e in seen] == [1, 2]
    epoch = (await backend.head("d")).epoch
    replay = await backend.read_after("d", epoch, 0)
    assert isinstance(replay, list) and [seq_of(e.frame) for e in replay] == [1, 2]


async def test_deepest_encodable_event_is_logged() -> None:
    backend = MemoryBackend()
    logged = await backend.append("d", {"type": "tool.done", "output": nested(253)})
    assert logged.seq == 1 and orjson.loads(logged.frame)["seq"] == 1


async def test_read_after_finds_events_by_seq_across_trimming() -> None:
    backend = MemoryBackend(log_max_events=5)
    for _ in range(12):
        await backend.append("d", {"type": "document.changed"})
    epoch = (await backend.head("d")).epoch
    window = await backend.read_after("d", epoch, 8, 10)
    assert isinstance(window, list) and [e.seq for e in window] == [9, 10]
    assert await backend.read_after("d", epoch, 6) == "history_truncated"
    tail = await backend.read_after("d", epoch, 7)
    assert isinstance(tail, list) and [e.seq for e in tail] == [8, 9, 10, 11, 12]


# -- memory eviction ----------------------------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_idle_documents_are_evicted_and_resume_sees_a_new_epoch() -> None:
    clock = Clock()
    backend = MemoryBackend(idle_s=60, max_documents=0, clock=clock)
    await backend.append("old", {"type": "document.changed"})
    old_epoch = (await backend.head("old")).epoch
    await backend.append_history("old", [{"role": "user", "content": "x"}])
    clock.now += 30
    await backend.append("recent", {"type": "document.changed"})
    clock.now += 31
    assert backend.evict() == 1  # "old" idle 61 s, "recent" 31 s
    assert await backend.read_history("old") == []
    assert await backend.read_after("old", old_epoch, 0) == "epoch_changed"
    assert (await backend.head("recent")).last_seq == 1


async def test_documents_in_use_are_never_evicted() -> None:
    clock = Clock()
    backend = MemoryBackend(idle_s=10, max_documents=1, clock=clock)
    seen: list[LoggedEvent] = []
    await backend.subscribe("watched", seen.append)
    await backend.claim_run("running", {"run_id": "r"}, 10)
    clock.now += 100
    for name in ("a", "b", "c"):
        await backend.append(name, {"type": "document.changed"})
        # over the cap of 1: the older unused ones go, the one being used stays
        assert backend.document_count == 3
    assert backend.evict() == 1  # "c" now: idle and over the cap
    assert backend.document_count == 2
    backend.unsubscribe("watched", seen.append)
    await backend.release_run("running", "r", "me")
    clock.now += 100
    backend.evict()
    assert backend.document_count == 0


async def test_count_cap_evicts_least_recently_used_first() -> None:
    backend = MemoryBackend(idle_s=0, max_documents=3, clock=Clock())
    for name in ("a", "b", "c"):
        await backend.append(name, {"type": "document.changed"})
    await backend.head("a")  # "a" used again: "b" is now the oldest
    await backend.append("d", {"type": "document.changed"})
    assert backend.document_count == 3 and backend.evictions == 1
    assert (await backend.head("a")).last_seq == 1  # kept
    assert (await backend.head("b")).last_seq == 0  # evicted: a fresh log


# -- the writer -----------------------------------------------------------------------------
async def _events(count: int, size: int = 10) -> list[LoggedEvent]:
    backend = MemoryBackend()
    return [await backend.append("d", {"type": "document.changed", "pad": "x" * size})
            for _ in range(count)]


async def test_writer_counts_bytes_and_abandons_a_blocked_send() -> None:
    blocked = asyncio.Event()
    sent: list[str] = []

    async def send(text: str) -> None:
        sent.append(text)
        blocked.set()
        await asyncio.Event().wait()  # the peer never reads

    async def backfill(after: int, until: int) -> None:
        return None

    out = Outbound(send, max_events=10_000, max_bytes=20_000, backfill=backfill)
    out.begin(None, 0, [])
    events = await _events(40, size=1000)
    writer = asyncio.create_task(out.run())
    out.push_event(events[0])
    await blocked.wait()
    for event in events[1:]:
        out.push_event(event)
        if out.close_request is not None:
            break
    assert out.close_request == CloseRequest(4009, "slow consumer: resume to catch up")
    assert out.queued_bytes == 0
    assert (await asyncio.wait_for(writer, 2)).code == 4009  # the blocked send was abandoned
    assert len(sent) == 1


async def test_one_large_frame_alone_is_not_a_slow_consumer() -> None:
    sent: list[str] = []

    async def send(text: str) -> None:
        sent.append(text)

    async def backfill(after: int, until: int) -> None:
        return None

    out = Outbound(send, max_events=100, max_bytes=16_384, backfill=backfill)
    out.begin(None, 0, [])
    (big,) = await _events(1, size=100_000)
    out.push_event(big)
    assert out.close_request is None
    out.close(CloseRequest(1000, "bye"))
    assert (await asyncio.wait_for(out.run(), 2)).code == 1000 and len(sent) == 1


async def test_writer_waits_out_a_backend_outage_while_filling_a_gap() -> None:
    backend = MemoryBackend()
    events = [await backend.append("d", {"type": "document.changed"}) for _ in range(4)]
    epoch = (await backend.head("d")).epoch
    failures = 3
    sent: list[int] = []

    async def send(text: str) -> None:
        sent.append(seq_of(text))

    async def backfill(after: int, until: int) -> Any:
        nonlocal failures
        if failures:
            failures -= 1
            raise BackendUnavailable("redis: connection refused")
        return await backend.read_after("d", epoch, after, until)

    out = Outbound(send, max_events=100, backfill=backfill)
    out.begin(None, 0, [])
    out.push_event(events[3])  # seq 4 reveals the gap 1..3
    out.close(CloseRequest(1000, "bye"))
    assert (await asyncio.wait_for(out.run(), 5)).code == 1000
    assert sent == [1, 2, 3, 4] and failures == 0


def test_a_tokens_user_is_known_whoever_issued_it() -> None:
    """Tokens issued here are looked up; others (another instance's, or older than the
    bounded map) are decoded, with the same answer."""
    from server import auth as auth_module

    auth = Authenticator(Settings(jwt_secret=SECRET))
    first = auth.issue_call_token(CallGrant("r", "c0", "alice", "d", 2**40))
    later = [auth.issue_call_token(CallGrant("r", f"c{i}", f"user{i}", "d", 2**40))
             for i in range(1, auth_module.ISSUED_USERS_KEPT + 50)]
    assert len(auth_module._ISSUED_USERS) <= auth_module.ISSUED_USERS_KEPT
    assert first not in auth_module._ISSUED_USERS and call_token_user(first) == "alice"
    assert later[-1] in auth_module._ISSUED_USERS and call_token_user(later[-1]) == "user" + str(
        auth_module.ISSUED_USERS_KEPT + 49)
    other = Authenticator(Settings(jwt_secret=SECRET + "-other"))
    foreign = other.issue_call_token(CallGrant("r", "cx", "bob", "d", 2**40))
    auth_module._ISSUED_USERS.pop(foreign)  # as if another instance had issued it
    assert call_token_user(foreign) == "bob"


async def test_tool_call_tokens_reach_only_the_runs_user() -> None:
    auth = Authenticator(Settings(jwt_secret=SECRET))
    call_token = auth.issue_call_token(CallGrant("r", "c", "alice", "d", 2**40))
    assert call_token_user(call_token) == "alice" and call_token_user("junk.x") is None
    backend = MemoryBackend()
    event = await backend.append("d", {"type": "tool.call", "run_id": "r", "call_id": "c",
                                       "name": "read", "arguments": {"a": 1},
                                       "executor": "client", "client_id": "t",
                                       "token": call_token, "expires_at": 1})
    frames: dict[str, list[dict[str, Any]]] = {"alice": [], "bob": []}

    async def backfill(after: int, until: int) -> None:
        return None

    for user, got in frames.items():
        async def send(text: str, got: list[dict[str, Any]] = got) -> None:
            got.append(orjson.loads(text))

        out = Outbound(send, max_events=100, backfill=backfill, user_id=user)
        out.begin(None, 0, [event])  # as a replay
        out.close(CloseRequest(1000, "bye"))
        await asyncio.wait_for(out.run(), 2)
    assert frames["alice"][0]["token"] == call_token
    assert "token" not in frames["bob"][0]
    assert {k: v for k, v in frames["alice"][0].items() if k != "token"} == frames["bob"][0]


# -- edge checks --------------------------------------------------------------------------------
@pytest.mark.parametrize("depth", [65, 100, 1000, 5000])
def test_decode_frame_refuses_deep_frames_naming_the_depth(depth: int) -> None:
    frame = orjson.dumps({"type": "ping", "id": "p"})[:-1].decode() + \
        ',"x":' + "[" * (depth - 1) + "]" * (depth - 1) + "}"
    failure = decode_frame(frame, 64)
    assert isinstance(failure, ParseFailure) and failure.code == ErrorCode.INVALID_MESSAGE
    assert "64" in failure.message and failure.details is not None
    assert failure.details[0]["max_depth"] == 64
    assert failure.reply_to == ("p" if depth <= 1024 else None)


def test_depth_scan_counts_levels_and_ignores_brackets_in_strings() -> None:
    assert not nesting_over(orjson.dumps({"a": nested(63)}), 64)  # 64 levels: allowed
    assert nesting_over(orjson.dumps({"a": nested(64)}), 64)
    tricky = orjson.dumps({"s": '[[[[{{{{\\"[[[', "t": "]]]]"}).decode()
    assert not nesting_over(tricky, 1)
    assert not nesting_over("[" * 5000 + "]" * 5000, 0)  # 0: no limit of ours


def test_integers_beyond_64_bits_are_refused() -> None:
    for value in ("18446744073709551616", "9223372036854775808", "-9223372036854775809",
                  "1" * 300):
        failure = decode_frame('{"type":"ping","ts":' + value + "}")
        assert isinstance(failure, ParseFailure) and "64-bit" in failure.message, value
    failure = decode_frame('{"type":"ping","ts":' + "1" * 400 + "}")  # beyond a double, too
    assert isinstance(failure, ParseFailure) and failure.code == ErrorCode.INVALID_MESSAGE
    for value in ("9223372036854775807", "-9223372036854775808", "1e300"):
        assert isinstance(decode_frame('{"type":"ping","ts":' + value + "}"), dict)
    assert not has_out_of_range_int('{"s":"18446744073709551616123"}')


def test_handshake_gate_closes_the_oldest_pending_socket_to_make_room() -> None:
    closed: list[str] = []
    gate = HandshakeGate(2)
    first = gate.enter(lambda: closed.append("first"))
    second = gate.enter(lambda: closed.append("second"))
    assert gate.pending == 2 and closed == []
    third = gate.enter(lambda: closed.append("third"))  # full: the oldest goes
    assert closed == ["first"] and gate.pending == 2 and gate.evicted == 1
    gate.leave(first)  # its own leave, later, changes nothing
    gate.leave(second)
    assert gate.pending == 1
    gate.enter(lambda: closed.append("fourth"))
    assert closed == ["first"] and gate.pending == 2
    gate.leave(third)
    unlimited = HandshakeGate(0)
    for _ in range(1000):
        unlimited.enter(lambda: closed.append("never"))
    assert "never" not in closed and unlimited.pending == 0


@pytest.mark.parametrize(
    ("claims", "key", "audience", "expected"),
    [
        ({"sub": "a", "exp": -10}, SECRET, None, "token expired"),
        ({"sub": "a", "exp": 2**40}, "another-secret-0123456789abcdef012345", None,
         "bad signature"),
        ({"sub": "a", "exp": 2**40, "aud": "other"}, SECRET, "cowrite", "wrong audience"),
        ({"sub": "a"}, SECRET, None, "token lacks the required 'exp' claim"),
        (None, SECRET, None, "malformed token"),
    ],
    ids=["expired", "signature", "audience", "missing-claim", "malformed"],
)
def test_auth_errors_are_in_our_words(claims: dict[str, Any] | None, key: str,
                                      audience: str | None, expected: str) -> None:
    auth = Authenticator(Settings(jwt_secret=SECRET, jwt_audience=audience))
    given = "e30.e30.<script>" if claims is None else jwt.encode(
        {**claims, "exp": int(time.time()) + claims["exp"]} if "exp" in claims else claims,
        key, algorithm="HS256")
    with pytest.raises(AuthError) as caught:
        auth.verify(given)
    assert str(caught.value) == expected


def test_text_logs_escape_control_characters() -> None:
    record = logging.LogRecord("cowrite", logging.INFO, __file__, 1,
                               "connected client %s", ("tab\n12:00:00 ERROR forged\x1b[2J",),
                               None)
    record.user_id = "eve\r\nx"
    line = TextFormatter().format(record)
    assert "\n" not in line and "\r" not in line and "\x1b" not in line
    assert "tab\\n12:00:00 ERROR forged\\x1b[2J" in line and "user_id=eve\\r\\nx" in line
