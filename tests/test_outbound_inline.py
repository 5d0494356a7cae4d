"""Inline sends (server/outbound.py): while a connection's writer is idle, the
next event or frame is sent by whoever publishes it, in the same loop
iteration; a send that must wait is finished by the writer before anything
queued after it, and a send that fails ends the writer with that error."""

import asyncio
from typing import Any

import orjson
import pytest

from server.auth import Authenticator, CallGrant
from server.backends.base import LoggedEvent
from server.backends.memory import MemoryBackend
from server.outbound import CloseRequest, Outbound
from server.settings import Settings


async def _events(count: int) -> list[LoggedEvent]:
    backend = MemoryBackend()
    return [await backend.append("d", {"type": "document.changed"}) for _ in range(count)]


async def _no_backfill(after: int, until: int) -> None:
    return None


async def _idle_writer(out: Outbound) -> "asyncio.Task[CloseRequest]":
    out.begin(None, 0, [])
    writer = asyncio.create_task(out.run())
    await asyncio.sleep(0)  # it finds nothing queued and waits
    assert not out.has_pending_send
    return writer


async def test_an_idle_writers_next_event_is_sent_by_its_publisher_at_once() -> None:
    sent: list[str] = []
    counted: list[str] = []

    async def send(text: str) -> None:
        sent.append(text)

    out = Outbound(send, max_events=100, backfill=_no_backfill, inline=True,
                   on_sent=counted.append)
    writer = await _idle_writer(out)
    events = await _events(2)
    out.push_event(events[0])
    out.push_frame("ack", '{"type":"ack","reply_to":"x"}')
    out.push_event(events[1])
    assert sent == [events[0].frame, '{"type":"ack","reply_to":"x"}', events[1].frame]
    assert counted == ["document.changed", "ack", "document.changed"]
    out.push_event(events[0])  # a duplicate is still dropped
    out.close(CloseRequest(1000, "bye"))
    assert (await asyncio.wait_for(writer, 2)).code == 1000
    assert len(sent) == 3


async def test_a_send_that_must_wait_is_finished_by_the_writer_before_later_events() -> None:
    room = asyncio.Event()
    sent: list[int] = []

    async def send(text: str) -> None:
        seq = int(orjson.loads(text)["seq"])
        if seq == 2:
            await room.wait()  # the peer's buffer is full for a while
        sent.append(seq)

    out = Outbound(send, max_events=100, backfill=_no_backfill, inline=True)
    writer = await _idle_writer(out)
    events = await _events(4)
    out.push_event(events[0])
    out.push_event(events[1])  # begins, then has to wait
    out.push_event(events[2])  # queued behind it
    assert sent == [1] and out.has_pending_send
    await asyncio.sleep(0.01)
    assert sent == [1]
    room.set()
    for _ in range(100):
        if sent == [1, 2, 3]:
            break
        await asyncio.sleep(0.001)
    assert sent == [1, 2, 3]
    out.push_event(events[3])  # idle again: inline
    assert sent == [1, 2, 3, 4]
    out.close(CloseRequest(1000, "bye"))
    assert (await asyncio.wait_for(writer, 2)).code == 1000


async def test_a_failed_inline_send_ends_the_writer_with_that_error() -> None:
    async def send(text: str) -> None:
        raise ConnectionResetError("peer went away")

    out = Outbound(send, max_events=100, backfill=_no_backfill, inline=True)
    writer = await _idle_writer(out)
    out.push_event((await _events(1))[0])  # the publisher is not the one to fail
    with pytest.raises(ConnectionResetError):
        await asyncio.wait_for(writer, 2)


async def test_a_blocked_inline_send_does_not_hold_a_slow_consumer_close() -> None:
    async def send(text: str) -> None:
        await asyncio.Event().wait()  # the peer never reads

    out = Outbound(send, max_events=3, backfill=_no_backfill, inline=True)
    writer = await _idle_writer(out)
    for event in await _events(6):
        out.push_event(event)
    assert out.close_request is not None and out.close_request.code == 4009
    assert (await asyncio.wait_for(writer, 2)).code == 4009


async def test_an_inline_tool_call_keeps_its_token_for_the_runs_user_only() -> None:
    token = Authenticator(Settings(jwt_secret="s" * 40)).issue_call_token(
        CallGrant("r", "c", "alice", "d", 2**40))
    event = await MemoryBackend().append("d", {
        "type": "tool.call", "run_id": "r", "call_id": "c", "name": "read", "arguments": {},
        "executor": "client", "client_id": "t", "token": token, "expires_at": 1})
    got: dict[str, dict[str, Any]] = {}
    for user in ("alice", "bob"):
        async def send(text: str, user: str = user) -> None:
            got[user] = orjson.loads(text)

        out = Outbound(send, max_events=100, backfill=_no_backfill, inline=True, user_id=user)
        writer = await _idle_writer(out)
        out.push_event(event)
        out.close(CloseRequest(1000, "bye"))
        await asyncio.wait_for(writer, 2)
    assert got["alice"]["token"] == token and "token" not in got["bob"]
