"""What a client sends around its requests cannot hold a connection, and a request
head is bounded exactly (server/httpguard.py).

Raw sockets: an HTTP client library would not send most of this. Every test runs on
both event loops: in the test's asyncio loop, and under uvloop, which production runs
(`python -m server` for the app's routes; a uvicorn thread on uvloop for the streamed
answer test, which needs a route that streams slowly).
"""

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass

import orjson
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from bench.common import BENCH_SECRET, server_process
from server import httpguard
from server.adapters import http as adapter_http
from server.httpguard import HEAD_MAX_BYTES, LINGER_S
from tests.harness import SECRET, free_port, logged, running_server, token

LOOPS = ["asyncio", pytest.param("uvloop", marks=pytest.mark.slow)]
Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]


@dataclass
class Edge:
    port: int
    secret: str
    loop: str

    async def connect(self) -> Streams:
        return await asyncio.open_connection("127.0.0.1", self.port)


@pytest.fixture(params=LOOPS)
async def edge(request: pytest.FixtureRequest) -> AsyncIterator[Edge]:
    """The cowrite server (dev mode: /v1/dev/token reads a body), in this loop or as
    `python -m server` on uvloop."""
    if request.param == "asyncio":
        async with running_server(dev=True) as server:
            yield Edge(server.settings.port, SECRET, "asyncio")
    else:
        async with server_process("cowrite", COWRITE_DEV="1") as proc:
            yield Edge(proc.port, BENCH_SECRET, "uvloop")


async def answer(reader: asyncio.StreamReader, timeout: float = 5.0) -> tuple[int, bytes]:
    """One response's status and body (the server's answers here have a content-length)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    body = await asyncio.wait_for(reader.readexactly(length), timeout)
    return int(head.split(b" ", 2)[1]), body


async def closed_within(writer: asyncio.StreamWriter, seconds: float, byte: bytes) -> bool:
    """Send `byte` every 0.2 s (each one used to restart nothing: uvicorn cancels its
    keep-alive timer on every byte) until the server has closed the socket (a write is
    refused: the kernel resets a closed socket's connection) or `seconds` have passed."""
    deadline = asyncio.get_running_loop().time() + seconds
    while asyncio.get_running_loop().time() < deadline:
        if writer.transport.is_closing():
            return True
        try:
            writer.write(byte)
            await writer.drain()
        except ConnectionError:
            return True
        await asyncio.sleep(0.2)
    return False


def post(path: str, headers: bytes = b"", method: bytes = b"POST") -> bytes:
    return b"%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n%s\r\n" % (
        method, path.encode(), headers)


async def test_a_body_still_arriving_after_its_answer_does_not_hold_the_connection(
        edge: Edge, monkeypatch: pytest.MonkeyPatch) -> None:
    """A body trickled a byte at a time after the answer held the socket for ever (240
    such sockets took every descriptor of a server with `ulimit -n 256`)."""
    good = f"Authorization: Bearer {token(secret=edge.secret)}\r\n".encode()
    huge = b"Content-Length: 100000000\r\n"
    cases: list[tuple[bytes, int, bytes]] = [  # request head, its answer, what is trickled
        (post("/v1/agui/doc-1", huge), 401, b"a"),  # no token: answered before the body
        (post("/v1/agui/doc-1", b"Transfer-Encoding: chunked\r\n"), 401, b"1\r\na\r\n"),
        (post("/healthz", b"Content-Length: 1000000000\r\n", b"GET"), 200, b"a"),  # reads none
        (post("/v1/agui/doc-1", good + huge), 413, b"a"),  # declared over the limit
        (post("/v1/agui/doc-1", huge + b"Expect: 100-continue\r\n"), 401, b"a"),
    ]
    if edge.loop == "asyncio":  # a body slower than the adapters' deadline: 408
        monkeypatch.setattr(adapter_http, "BODY_TIMEOUT_S", 0.5)
        cases.append((post("/v1/agui/doc-1", good + b"Content-Length: 1000\r\n"), 408, b"a"))

    async def case(head: bytes, status: int, byte: bytes) -> None:
        reader, writer = await edge.connect()
        try:
            writer.write(head + (byte if status == 408 else b""))
            if status == 408:  # the body is being read: trickle it until the deadline
                for _ in range(4):
                    await asyncio.sleep(0.2)
                    writer.write(byte)
            got, body = await answer(reader)  # the whole answer reaches the client
            assert got == status, (head, got, body)
            assert status == 200 or orjson.loads(body)["code"]
            assert await closed_within(writer, LINGER_S + 3, byte), head  # was open for ever
        finally:
            writer.close()

    await asyncio.gather(*(case(*c) for c in cases))

    # A body that arrived whole is not dropped: the connection is kept alive.
    reader, writer = await edge.connect()
    try:
        writer.write(post("/v1/agui/doc-1", b"Content-Length: 2\r\n") + b"{}")
        assert (await answer(reader))[0] == 401
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert await answer(reader) == (200, b'{"status":"ok"}')
        # A body read by its route while it trickles in is answered, and kept alive.
        body = orjson.dumps({"user": "bob", "docs": ["doc-1"]})
        writer.write(post("/v1/dev/token", b"Content-Length: %d\r\n" % len(body)))
        for start in range(0, len(body), 8):
            await asyncio.sleep(0.05)
            writer.write(body[start:start + 8])
        issued, data = await answer(reader)
        assert issued == 200 and "token" in orjson.loads(data)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert await answer(reader) == (200, b'{"status":"ok"}')
    finally:
        writer.close()


def sized_head(size: int, header: bytes = b"Connection: close") -> bytes:
    """A `GET /healthz` head of exactly `size` bytes, its final empty line included."""
    start, end = b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + header + b"\r\nX-Pad: ", b"\r\n\r\n"
    return start + b"a" * (size - len(start) - len(end)) + end


async def send_head(edge: Edge, head: bytes, how: str) -> int:
    """The status `head` gets when written as `how` says (then the server closes)."""
    reader, writer = await edge.connect()
    try:
        if how == "kept alive":  # the second request on a connection
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await answer(reader))[0] == 200
        cuts = {"one write": [len(head)], "kept alive": [len(head)],
                "60 000 bytes, then the rest": [60_000, len(head)],
                "1 000 bytes a write": [*range(1_000, len(head), 1_000), len(head)]}[how]
        sent = 0
        for cut in cuts:
            writer.write(head[sent:cut])
            await writer.drain()
            await asyncio.sleep(0.002 if cut - sent <= 1_000 else 0.05)  # a read each
            sent = cut
        got, _ = await answer(reader)
        assert await asyncio.wait_for(reader.read(), 5) == b""
        return got
    finally:
        writer.close()


async def test_a_request_head_over_64_kib_is_431_whatever_the_reads(edge: Edge) -> None:
    """The size was checked after each read: a head that ended inside the read crossing
    the limit was served (a 100,924-byte head got 200; up to ~128 KiB did)."""
    hows = ["one write", "60 000 bytes, then the rest", "1 000 bytes a write", "kept alive"]
    sizes = {HEAD_MAX_BYTES: 200, HEAD_MAX_BYTES + 1: 431, 100_924: 431}
    runs = [(size, how) for size in sizes for how in hows]
    got = await asyncio.gather(*(send_head(edge, sized_head(size), how) for size, how in runs))
    assert dict(zip(runs, got, strict=True)) == {(size, how): sizes[size] for size, how in runs}

    # Small pipelined requests, and a head followed by its body in one write, are served.
    reader, writer = await edge.connect()
    try:
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" * 3)
        for _ in range(3):
            assert await answer(reader) == (200, b'{"status":"ok"}')
        body = b"x" * 100_000  # not counted with the head
        writer.write(sized_head(HEAD_MAX_BYTES, b"Content-Length: 100000") + body)
        assert await answer(reader) == (200, b'{"status":"ok"}')
    finally:
        writer.close()


async def test_empty_lines_between_requests_do_not_hold_the_connection(
        edge: Edge, monkeypatch: pytest.MonkeyPatch) -> None:
    """The parser skips empty lines before a request line; sent every few seconds after
    an answer, they cancelled uvicorn's keep-alive timer and started no head's time."""
    wait = httpguard.HEAD_TIMEOUT_S
    if edge.loop == "asyncio":
        monkeypatch.setattr(httpguard, "HEAD_TIMEOUT_S", 0.5)
        wait = 0.5
    reader, writer = await edge.connect()
    try:
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert await answer(reader) == (200, b'{"status":"ok"}')
        trickle = asyncio.create_task(closed_within(writer, wait + LINGER_S + 3, b"\r\n"))
        status, _ = await answer(reader, wait + 3)  # was open for ever, unanswered
        assert status == 408
        assert await trickle
    finally:
        writer.close()


async def _slow_stream() -> AsyncIterator[bytes]:
    for n in range(8):
        yield b"data: %d\n\n" % n
        await asyncio.sleep(0.1)


async def _stream(_: Request) -> Response:
    return StreamingResponse(_slow_stream(), media_type="text/event-stream")


@contextlib.asynccontextmanager
async def streaming_server(loop: str) -> AsyncIterator[int]:
    """uvicorn with cowrite's protocol and a route that streams for 0.8 s: in this loop,
    or on uvloop in a thread of its own."""
    config = uvicorn.Config(Starlette(routes=[Route("/stream", _stream)]), port=free_port(),
                            http=httpguard.GuardedHttpProtocol, lifespan="off",
                            log_level="warning", loop=loop)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    task = asyncio.create_task(server.serve()) if loop == "asyncio" else None
    if task is None:
        thread.start()
    try:
        while not server.started:
            if task.done() if task else not thread.is_alive():
                raise RuntimeError("the streaming server did not start")
            await asyncio.sleep(0.01)
        yield config.port
    finally:
        server.should_exit = True
        await (asyncio.wait_for(task, 10) if task else asyncio.to_thread(thread.join, 10))


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("refused", ["431", "408"])
async def test_a_refused_pipelined_head_is_answered_after_the_stream_under_way(
        loop: str, refused: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A head refused while the answer before it streamed was answered inside the stream,
    whose next write then raised in the app ("Cannot call write() after write_eof()")."""
    monkeypatch.setattr(httpguard, "HEAD_TIMEOUT_S", 0.3)
    pipelined = b"GET /stream HTTP/1.1\r\nHost: x\r\n"
    if refused == "431":
        pipelined += b"X-Pad: " + b"a" * HEAD_MAX_BYTES + b"\r\n"
    with logged("uvicorn.error", logging.ERROR) as errors:
        async with streaming_server(loop) as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                writer.write(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
                await asyncio.sleep(0.15)
                writer.write(pipelined)
                received = await asyncio.wait_for(reader.read(-1), 10)
            finally:
                writer.close()
    streamed, _, after = received.partition(b"0\r\n\r\n")  # the stream's last chunk
    assert all(b"data: %d" % n in streamed for n in range(8)), received
    assert after.startswith(b"HTTP/1.1 " + refused.encode()), received
    assert errors == []
