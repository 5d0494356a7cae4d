"""Request heads are bounded in size and time, and a refused upgrade is answered.

Raw sockets: an HTTP client library would refuse to send most of these.
"""

import asyncio
import logging

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from server import httpguard
from tests.harness import Server, joined, logged, running_server

UPGRADE = (b"GET /v1/documents/doc-1/ws HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\n"
           b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
           b"Sec-WebSocket-Version: 13\r\n")


async def exchange(server: Server, request: bytes, timeout: float = 5.0) -> bytes:
    """Send `request`, return everything the server answers before it closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.settings.port)
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), timeout)
    finally:
        writer.close()


def status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


@pytest.mark.parametrize("extra", [
    b"Sec-WebSocket-Protocol: " + b"a" * 9_000 + b"\r\n",  # one line over websockets' 8 KiB
    b"".join(b"X-Header-%d: v\r\n" % i for i in range(200)),  # over its 128 headers
], ids=["long-line", "many-headers"])
async def test_an_upgrade_websockets_cannot_parse_is_answered_431(server: Server, extra: bytes
                                                                  ) -> None:
    answer = await exchange(server, UPGRADE + extra + b"\r\n")  # used to hang: no answer at all
    assert status(answer) == 431
    async with joined(server) as (_, welcome):  # the server still serves sockets
        assert welcome["protocol"] == 1


async def test_a_request_head_over_64_kib_is_431_and_a_large_body_is_not(server: Server) -> None:
    big = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 1_000_000 + b"\r\n\r\n"
    answer = await exchange(server, big)  # was read whole and answered 200
    assert status(answer) == 431 and answer.endswith(b"larger than 65536 bytes")
    fits = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Big: " + \
        b"a" * 60_000 + b"\r\n\r\n"
    assert status(await exchange(server, fits)) == 200
    async with running_server(dev=True) as dev, httpx.AsyncClient(base_url=dev.http) as http:
        issued = await http.post("/v1/dev/token", json={"user": "bob", "pad": "x" * 60_000})
        assert issued.status_code == 200 and "token" in issued.json()
        # past the route's own 64 KiB: its 413, not the head's 431
        refused = await http.post("/v1/dev/token", json={"user": "bob", "pad": "x" * 300_000})
        assert refused.status_code == 413 and "larger than" in refused.json()["error"]


async def test_a_head_that_does_not_arrive_in_time_is_408(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    monkeypatch.setattr(httpguard, "HEAD_TIMEOUT_S", 0.5)
    async with running_server() as server:
        started = asyncio.get_running_loop().time()
        answer = await exchange(server, b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        assert status(answer) == 408  # was held open for as long as the client liked
        assert asyncio.get_running_loop().time() - started < 4
        assert status(await exchange(server, b"")) == 408  # connected, never wrote

        # A kept-alive connection: the second request's head gets its own time.
        reader, writer = await asyncio.open_connection("127.0.0.1", server.settings.port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        first = await asyncio.wait_for(reader.readuntil(b'{"status":"ok"}'), 5)
        assert status(first) == 200
        await asyncio.sleep(0.4)  # most of the first head's time: it no longer counts
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        second = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        assert status(second) == 408

        # A head trickling in within the time is served.
        reader, writer = await asyncio.open_connection("127.0.0.1", server.settings.port)
        for part in (b"GET /healthz HTTP/1.1\r\n", b"Host: x\r\n", b"Connection: close\r\n\r\n"):
            writer.write(part)
            await asyncio.sleep(0.1)
        served = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        assert status(served) == 200


async def test_a_refused_upgrade_is_answered_without_an_error_in_the_log(server: Server) -> None:
    with logged("uvicorn.error", logging.WARNING) as lines:
        for path, refused in (("/v1/documents/%00/ws", 404), ("/no/such/socket", 403)):
            with pytest.raises(InvalidStatus) as raised:
                async with connect(f"ws://127.0.0.1:{server.settings.port}{path}"):
                    pass
            assert raised.value.response.status_code == refused
        await asyncio.sleep(0.1)
    # each refusal logged "ASGI callable returned without completing handshake." at ERROR
    assert lines == []
