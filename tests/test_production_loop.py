"""The protections that reach under ASGI for the connection's transport, checked under
`python -m server` itself. uvicorn runs it on uvloop (`loop="auto"`), whose transports
subclass none of asyncio's transport classes; the in-process test servers run on the
test's asyncio loop. An `isinstance(transport, asyncio.WriteTransport)` test once turned
the pre-hello frame limit and the handshake cap's closes off in production while every
in-process test of them passed (a 4 MiB frame per silent socket was buffered again).
"""

import asyncio
import contextlib

import orjson
import pytest

from bench.common import server_process
from server.transport import AbortableTransport
from server.wsprotocol import HELLO_MAX_BYTES
from tests.harness import SECRET, RawClient, token, ws_client

pytestmark = pytest.mark.slow

PATH = "/v1/documents/doc-1/ws"


def test_the_production_server_runs_on_uvloop() -> None:
    """What makes this module necessary: uvloop is installed (uvicorn[standard]), so
    `python -m server` runs on it, and its transport is no asyncio.WriteTransport."""
    import uvloop

    async def transport_kind() -> tuple[bool, bool]:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(asyncio.Protocol, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        transport, _ = await loop.create_connection(asyncio.Protocol, "127.0.0.1", port)
        try:
            return (isinstance(transport, asyncio.WriteTransport),
                    isinstance(transport, AbortableTransport))
        finally:
            transport.close()
            server.close()

    assert uvloop.run(transport_kind()) == (False, True)


async def test_before_the_hello_a_frame_over_64_kib_fails_the_connection() -> None:
    async with server_process("cowrite", COWRITE_JWT_SECRET=SECRET) as proc:
        async with ws_client(proc.url(PATH)) as client:
            await client.ws.send("x" * (HELLO_MAX_BYTES + 1))
            assert await client.expect_close() == 1009  # was: read whole, answered, 4001


async def test_over_the_handshake_cap_the_oldest_silent_socket_is_closed() -> None:
    async with server_process("cowrite", COWRITE_JWT_SECRET=SECRET,
                              COWRITE_MAX_PENDING_HANDSHAKES="2",
                              COWRITE_HELLO_TIMEOUT_S="60") as proc:
        silent = [await RawClient.connect(proc.port, PATH) for _ in range(4)]
        try:
            for old in silent[:2]:  # made room for the two newest (all four stayed open)
                _, code = await asyncio.wait_for(old.read_until_close(), 5)
                assert code is None
            newest = silent[-1]
            newest.send({"type": "hello", "protocol": 1, "client_id": "t", "token": token()})
            opcode, payload = await asyncio.wait_for(newest.read_frame(), 5)
            assert opcode == 1 and orjson.loads(payload)["type"] == "welcome"
        finally:
            for client in silent:
                with contextlib.suppress(Exception):
                    client.close()
