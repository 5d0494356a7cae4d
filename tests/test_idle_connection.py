"""What an idle connection holds: the token-expiry wheel (one timer for all
connections), the lean receive queue and write flag given to uvicorn's
protocol, and, over real sockets, no task per connection beyond its ASGI task
and its writer."""

import asyncio
from typing import Any

import pytest

from protocol.codes import CloseCode
from server.auth import Principal
from server.connection import Connection
from server.observability import Metrics
from server.outbound import CloseRequest, Outbound
from server.tasks import ExpiryWheel
from server.transport import TRANSPORT_KEY
from server.wsprotocol import Flag, Inbox
from tests.harness import joined, running_server

EXPIRED = CloseRequest(int(CloseCode.UNAUTHENTICATED), "token expired")


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


async def _nothing(_after: int, _until: int) -> None:
    return None


async def _send(_text: str) -> None:
    return None


def _conn(expires_at: float, name: str = "c") -> Connection:
    outbound = Outbound(_send, max_events=10, backfill=_nothing)
    return Connection(session_id=name, document_id="d", client_id=name,
                      principal=Principal("u", frozenset({"*"}), "editor", expires_at),
                      outbound=outbound, metrics=Metrics())


async def test_expiry_wheel_closes_each_connection_when_its_token_expires() -> None:
    clock = Clock(1000.98)
    wheel = ExpiryWheel(clock)
    soon, later, gone = _conn(1000.99, "soon"), _conn(1002.0, "later"), _conn(1000.99, "gone")
    for conn in (soon, later, gone):
        wheel.watch(conn)
    wheel.unwatch(gone)  # the connection ended first
    assert len(wheel) == 2
    clock.now = 1001.0  # the timer is armed for second 1001, 20 ms from now
    await asyncio.sleep(0.1)
    assert soon.outbound.close_request == EXPIRED
    assert later.outbound.close_request is None and gone.outbound.close_request is None
    assert len(wheel) == 1


async def test_expiry_wheel_refresh_and_expired_tokens() -> None:
    clock = Clock(1000.98)
    wheel = ExpiryWheel(clock)
    refreshed, expired = _conn(1000.99, "refreshed"), _conn(1000.0, "expired")
    wheel.watch(refreshed)
    refreshed.principal = Principal("u", frozenset({"*"}), "editor", 5000.0)  # auth.refresh
    wheel.watch(refreshed)
    wheel.watch(expired)  # already past its exp: closed at once, not watched
    assert expired.outbound.close_request == EXPIRED
    clock.now = 1001.0
    await asyncio.sleep(0.1)
    assert refreshed.outbound.close_request is None
    assert len(wheel) == 1


async def test_expiry_wheel_stays_small_under_churn() -> None:
    """Connections that come and go, each token expiring at another far-off
    second, must not leave their seconds behind."""
    wheel = ExpiryWheel(Clock(1000.0))
    for i in range(5000):
        conn = _conn(10_000.0 + i, f"c{i}")
        wheel.watch(conn)
        wheel.unwatch(conn)
    assert len(wheel) == 0
    assert len(wheel._due) <= 64 + 1  # stale seconds are swept, not kept


async def test_inbox_is_a_fifo_that_wakes_its_receiver() -> None:
    inbox = Inbox()
    inbox.put_nowait(1)
    inbox.put_nowait(2)
    assert not inbox.empty()
    assert [await inbox.get(), await inbox.get()] == [1, 2] and inbox.empty()
    waiting = asyncio.create_task(inbox.get())
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError):  # one receiver at a time, as ASGI has
        await inbox.get()
    inbox.put_nowait(3)
    assert await asyncio.wait_for(waiting, 1) == 3
    cancelled = asyncio.create_task(inbox.get())
    await asyncio.sleep(0)
    cancelled.cancel()
    await asyncio.gather(cancelled, return_exceptions=True)
    inbox.put_nowait(4)  # a cancelled receive leaves the inbox usable
    assert await asyncio.wait_for(inbox.get(), 1) == 4


async def test_flag_blocks_waiters_until_set() -> None:
    flag = Flag(True)
    assert await asyncio.wait_for(flag.wait(), 1)  # set: no wait
    flag.clear()
    waiters = [asyncio.create_task(flag.wait()) for _ in range(3)]
    cancelled = asyncio.create_task(flag.wait())
    await asyncio.sleep(0.01)
    assert not any(w.done() for w in waiters)
    cancelled.cancel()
    await asyncio.gather(cancelled, return_exceptions=True)
    flag.set()
    assert await asyncio.wait_for(asyncio.gather(*waiters), 1) == [True, True, True]
    assert flag.is_set()


def _server_tasks() -> list[str]:
    """The running tasks' coroutines that are not the test's websockets clients."""
    names = []
    for task in asyncio.all_tasks():
        code = getattr(task.get_coro(), "cr_code", None)
        filename = code.co_filename if code is not None else ""
        if "websockets/asyncio" not in filename:
            names.append(str(getattr(task.get_coro(), "__qualname__", "?")))
    return names


async def test_an_idle_connection_costs_two_tasks() -> None:
    """Its ASGI task (which reads) and its writer: no reader task, no task or
    timer per token expiry, however many connections idle."""
    async with running_server() as srv:
        async with joined(srv, client_id="first"):
            await asyncio.sleep(0.05)
            before = _server_tasks()
            async with joined(srv, client_id="a"), joined(srv, client_id="b"), \
                    joined(srv, client_id="c"):
                await asyncio.sleep(0.05)
                added = _server_tasks()
                for name in before:
                    added.remove(name)
                assert sorted(added) == sorted(3 * ["WebSocketsSansIOProtocol.run_asgi",
                                                    "Outbound.run"])


def _await_chain(task: "asyncio.Task[Any]") -> list[Any]:
    """The coroutines a suspended task holds, outermost first."""
    chain: list[Any] = []
    awaiting: Any = task.get_coro()
    while awaiting is not None and hasattr(awaiting, "cr_frame"):
        if awaiting.cr_frame is not None:
            chain.append(awaiting)
        awaiting = awaiting.cr_await
    return chain


async def test_an_idle_connection_waits_past_no_router_frames() -> None:
    """Its ASGI task reaches the endpoint without Starlette's router, route and
    exception wrappers (server/direct_route.py): ~4 KiB less per idle connection,
    and fewer frames resumed at every frame it receives."""
    async with running_server() as srv, joined(srv, client_id="idle"):
        await asyncio.sleep(0.05)
        asgi = [task for task in asyncio.all_tasks()
                if getattr(task.get_coro(), "__qualname__", "").endswith("run_asgi")]
        assert len(asgi) == 1
        coroutines = _await_chain(asgi[0])
        chain = [f"{c.cr_code.co_filename}:{c.cr_code.co_name}" for c in coroutines]
        assert any(frame.endswith("server/endpoint.py:_live") for frame in chain), chain
        assert not [frame for frame in chain if "starlette/routing.py" in frame
                    or "starlette/_exception_handler.py" in frame
                    or "starlette/middleware/exceptions.py" in frame], chain
        # TransportHandle ran first: the endpoint can abort a peer that stops reading.
        socket = next(c for c in coroutines if c.cr_code.co_name == "document_socket")
        assert TRANSPORT_KEY in socket.cr_frame.f_locals["ws"].scope
