"""The AI SDK WebSocket (`GET /v1/ai-sdk/{doc}/ws`) under the document socket's limits
(from a security review; each case was reproduced against a real server first): the
deadline for a first authenticated request runs from the upgrade, whatever the socket
sends meanwhile, and the socket counts against `COWRITE_MAX_CONNECTIONS_PER_USER`."""

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
import pytest
from websockets.exceptions import ConnectionClosed

from tests.harness import Client, Server, running_server, token, ws_client
from tests.redis_support import redis_process


def _url(server: Server, document_id: str = "doc-1", sub: str | None = "alice") -> str:
    base = f"ws://127.0.0.1:{server.settings.port}/v1/ai-sdk/{document_id}/ws"
    return base if sub is None else f"{base}?token={token(sub)}"


def _resume(request_id: str, sub: str | None = None) -> dict[str, Any]:
    """The transport's `resume` (a chat with no run: answered `no-active`), with `sub`'s
    token in its headers when given."""
    frame: dict[str, Any] = {"type": "resume", "requestId": request_id, "id": "chat-1"}
    if sub is not None:
        frame["headers"] = {"authorization": f"Bearer {token(sub)}"}
    return frame


async def _answer(client: Client, request_id: str) -> dict[str, Any]:
    """The frame that answers `request_id` (`no-active`, `error`, `start`)."""
    while True:
        frame = await client.recv()
        if frame.get("requestId") == request_id:
            return frame


async def _closed(client: Client) -> int | None:
    with contextlib.suppress(ConnectionClosed, TimeoutError):
        while True:
            await client.recv()
    return client.ws.close_code


@contextlib.asynccontextmanager
async def _document_socket(server: Server, sub: str = "alice", client_id: str = "tab"
                           ) -> AsyncIterator[dict[str, Any]]:
    """A document socket's hello; its first answer (`welcome`, or an `error` before a
    close), with the socket kept open while inside."""
    async with ws_client(server.ws_url()) as client:
        await client.send({"type": "hello", "protocol": 1, "client_id": client_id,
                           "token": token(sub)})
        first = await client.recv()
        if first["type"] == "error":
            first["close_code"] = await client.expect_close()
        yield first


async def _refused_document_socket(server: Server, sub: str = "alice") -> bool:
    async with _document_socket(server, sub, "probe") as first:
        return first.get("close_code") == 4008 and first.get("code") == "rate_limited"


async def _eventually_admitted(server: Server, sub: str = "alice") -> bool:
    """Whether a document socket gets its welcome within a few seconds (a slot freed
    by a socket that just closed is released once the server has seen the close)."""
    for _ in range(50):
        async with _document_socket(server, sub, "probe") as first:
            if first["type"] == "welcome":
                return True
        await asyncio.sleep(0.1)
    return False


def _abort(_index: int) -> dict[str, Any]:
    return {"type": "abort", "requestId": "r1"}


def _bad_token_resume(index: int) -> dict[str, Any]:
    return {**_resume(f"r{index}"), "headers": {"authorization": "Bearer nope"}}


@pytest.mark.parametrize("frame", [_abort, _bad_token_resume], ids=["abort", "bad-token"])
async def test_a_socket_that_keeps_talking_without_a_good_token_is_closed_in_time(
        frame: Callable[[int], dict[str, Any]]) -> None:
    # Each read had a deadline of its own: a frame every 4 s (hello timeout 5 s) held the
    # socket, and its handshake slot, for ever.
    async with running_server(hello_timeout_s=1.0) as server:
        async with ws_client(_url(server, sub=None)) as client:
            loop = asyncio.get_running_loop()
            opened = loop.time()
            with contextlib.suppress(ConnectionClosed):
                for index in range(12):  # 4.8 s of frames, one every 0.4 s
                    await client.send(frame(index))
                    with contextlib.suppress(TimeoutError):
                        while True:  # the bad tokens' errors
                            await client.recv(timeout=0.4)
            assert client.ws.close_code == 4001, "still open after 4.8 s"
            assert loop.time() - opened < 2.0
            assert server.app.state.handshakes.pending == 0


async def test_ai_sdk_sockets_count_against_the_users_connection_cap() -> None:
    # With the cap at 2 the third document socket was refused, but the same user kept 20
    # AI SDK sockets open, each streaming up to 32 requests.
    async with running_server(max_connections_per_user=2) as server:
        async with _document_socket(server, client_id="a"), \
                _document_socket(server, client_id="b"):
            async with ws_client(_url(server)) as over:
                await over.send(_resume("r1"))
                refused = await _answer(over, "r1")
                assert refused["errorText"] == "rate_limited: at most 2 connections per user"
                assert await _closed(over) == 4008
            async with ws_client(_url(server, sub="bob")) as bob:  # others are not affected
                await bob.send(_resume("r1"))
                assert (await _answer(bob, "r1"))["type"] == "no-active"
        async with _document_socket(server, client_id="a"):
            async with ws_client(_url(server)) as client:
                await client.send(_resume("r1"))
                assert (await _answer(client, "r1"))["type"] == "no-active"
                await client.send(_resume("r2"))  # one slot per socket, not per request
                assert (await _answer(client, "r2"))["type"] == "no-active"
                assert await _refused_document_socket(server)  # the AI SDK socket holds one
        assert await _eventually_admitted(server)  # freed when the socket closed
        async with _document_socket(server, client_id="a"), \
                _document_socket(server, client_id="b"):
            pass  # both slots were freed


async def test_requests_sent_at_once_take_one_slot() -> None:
    """The slot is taken before a request's task starts: two first requests in a row
    would otherwise both have found the socket without one."""
    async with running_server(max_connections_per_user=2) as server:
        async with ws_client(_url(server)) as client:
            for index in range(4):
                await client.ws.send(orjson.dumps(_resume(f"r{index}")).decode())
            for index in range(4):
                assert (await _answer(client, f"r{index}"))["type"] == "no-active"
            async with _document_socket(server) as first:
                assert first["type"] == "welcome"
                assert await _refused_document_socket(server)


async def test_a_socket_is_its_first_users() -> None:
    """Each frame carries its own token: the socket's slot is the user's of the first
    good one, and another user's request is refused (the socket stays), else one socket
    served any number of users while counting against one of them."""
    async with running_server(max_connections_per_user=1) as server:
        async with ws_client(_url(server, sub=None)) as client:
            await client.send(_bad_token_resume(0))
            assert (await _answer(client, "r0"))["errorText"].startswith("invalid_token: ")
            await client.send(_resume("a1", "alice"))
            assert (await _answer(client, "a1"))["type"] == "no-active"
            await client.send(_resume("b1", "bob"))
            refused = await _answer(client, "b1")
            assert refused["errorText"] == ("forbidden: this socket belongs to the user of "
                                            "its first request; open another one for this "
                                            "user")
            await client.send(_resume("a2", "alice"))  # the socket goes on for its user
            assert (await _answer(client, "a2"))["type"] == "no-active"
            await client.send(_resume("a3"))  # no header and no query token
            assert (await _answer(client, "a3"))["errorText"] == "invalid_token: missing token"
            assert await _refused_document_socket(server, "alice")
            async with _document_socket(server, "bob") as first:  # bob holds no slot
                assert first["type"] == "welcome"


async def test_the_slot_is_shared_through_redis_and_survives_an_outage() -> None:
    """With Redis the slot is the cluster's count; a request the backend cannot count
    (Redis down) is answered `unavailable` and leaves the socket waiting for the next."""
    async with redis_process() as redis, \
            running_server(redis_url=redis.url, max_connections_per_user=1,
                           hello_timeout_s=30.0) as server:
        async with ws_client(_url(server)) as client:
            await redis.stop()
            await client.send(_resume("r1"))
            down = await _answer(client, "r1")
            assert down["errorText"] == "unavailable: the shared backend is unavailable"
            await redis.start()
            for attempt in range(50):  # the client reconnects to Redis
                await client.send(_resume(f"again{attempt}"))
                answer = await _answer(client, f"again{attempt}")
                if answer["type"] == "no-active":
                    break
                await asyncio.sleep(0.1)
            else:
                pytest.fail(f"never served after the outage: {answer}")
            assert await _refused_document_socket(server)
        assert await _eventually_admitted(server)
