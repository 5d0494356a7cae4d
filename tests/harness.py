"""Real servers on free ports and a thin `websockets` client for the tests.

`running_server` runs the exact uvicorn configuration of `make run`
(server/runner.py) in the test's event loop, on a real socket.
"""

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import jwt
import orjson
import uvicorn
from starlette.applications import Starlette
from websockets.asyncio.client import ClientConnection, connect

from server.app import create_app
from server.runner import uvicorn_config
from server.services import Services
from server.settings import Settings

SECRET = "test-secret-0123456789abcdef0123456789"
RECV_TIMEOUT = 5.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def make_settings(**overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "jwt_secret": SECRET, "port": free_port(), "log_level": "warning", "log_json": False,
    }
    values.update(overrides)
    return Settings(**values)


def token(
    sub: str = "alice", docs: list[str] | None = None, role: str | None = None,
    ttl_s: float = 600, secret: str = SECRET, **claims: Any,
) -> str:
    payload: dict[str, Any] = {"sub": sub, "exp": int(time.time() + ttl_s)}
    payload["docs"] = ["*"] if docs is None else docs
    if role is not None:
        payload["role"] = role
    payload.update(claims)
    return jwt.encode(payload, secret, algorithm="HS256")


@dataclass
class Server:
    app: Starlette
    settings: Settings

    @property
    def services(self) -> Services:
        services: Services = self.app.state.services
        return services

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.settings.port}"

    def ws_url(self, document_id: str = "doc-1") -> str:
        return f"ws://127.0.0.1:{self.settings.port}/v1/documents/{document_id}/ws"


class QuickStopServer(uvicorn.Server):
    """uvicorn's server, stopped without its two fixed waits: its main loop notices
    `should_exit` only at its next 0.1 s tick, and its shutdown sleeps 0.1 s for the
    connections it asked to close even when there are none. Together ~0.15 s of every
    test's teardown, a minute over the suite's few hundred in-process servers. `stop()`
    wakes the loop at once; a shutdown with connections or requests still open is
    uvicorn's own, waits included."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._stop = asyncio.Event()

    def stop(self) -> None:
        self.should_exit = True
        self._stop.set()

    async def main_loop(self) -> None:
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            counter = (counter + 1) % 864000
            with contextlib.suppress(TimeoutError):  # a tick, as uvicorn's, or stop()
                await asyncio.wait_for(self._stop.wait(), 0.1)
            should_exit = await self.on_tick(counter)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.server_state.connections or self.server_state.tasks:
            await super().shutdown(sockets)
            return
        for listener in self.servers:  # nothing to ask to close, nothing to wait for
            listener.close()
        for sock in sockets or []:
            sock.close()
        for listener in self.servers:
            await listener.wait_closed()
        if not self.force_exit:
            await self.lifespan.shutdown()


@contextlib.asynccontextmanager
async def running_server(settings: Settings | None = None, **overrides: Any
                         ) -> AsyncIterator[Server]:
    settings = settings or make_settings(**overrides)
    app = create_app(settings)
    server = QuickStopServer(uvicorn_config(app, settings))
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            if task.done():
                task.result()
                raise RuntimeError("server did not start")
            await asyncio.sleep(0.01)
        yield Server(app, settings)
    finally:
        server.stop()
        await asyncio.wait_for(task, 15)


class Client:
    """A `websockets` connection speaking cowrite JSON."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.events: list[dict[str, Any]] = []
        self._taken: set[int] = set()

    async def send(self, message: dict[str, Any]) -> None:
        await self.ws.send(orjson.dumps(message).decode())

    async def recv(self, timeout: float = RECV_TIMEOUT) -> dict[str, Any]:
        raw = await asyncio.wait_for(self.ws.recv(), timeout)
        data: dict[str, Any] = orjson.loads(raw)
        self.events.append(data)
        return data

    async def recv_until(
        self, predicate: Callable[[dict[str, Any]], bool] | str, timeout: float = RECV_TIMEOUT
    ) -> dict[str, Any]:
        """The first event matching (a type name or a predicate) that no earlier
        call returned, whether it was already received or is still to come."""
        match = (lambda e: e.get("type") == predicate) if isinstance(predicate, str) else predicate
        for index, event in enumerate(self.events):
            if index not in self._taken and match(event):
                self._taken.add(index)
                return event
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                raise TimeoutError(f"no matching event; got {[e.get('type') for e in self.events]}")
            event = await self.recv(remaining)
            if match(event):
                self._taken.add(len(self.events) - 1)
                return event

    async def expect_close(self, timeout: float = RECV_TIMEOUT) -> int | None:
        """Drain frames until the server closes; return the close code."""
        with contextlib.suppress(Exception):
            async with asyncio.timeout(timeout):
                async for raw in self.ws:
                    self.events.append(orjson.loads(raw))
        await asyncio.wait_for(self.ws.wait_closed(), timeout)
        return self.ws.close_code

    async def close(self) -> None:
        await self.ws.close()


@contextlib.asynccontextmanager
async def ws_client(url: str, **kwargs: Any) -> AsyncIterator[Client]:
    kwargs.setdefault("compression", None)
    kwargs.setdefault("max_size", 16 * 1024 * 1024)
    async with connect(url, **kwargs) as ws:
        yield Client(ws)


@contextlib.asynccontextmanager
async def joined(
    server: Server, document_id: str = "doc-1", *, sub: str = "alice", client_id: str = "tab-1",
    role: str | None = None, resume: dict[str, Any] | None = None, **kwargs: Any,
) -> AsyncIterator[tuple[Client, dict[str, Any]]]:
    """A client that said hello and got its welcome."""
    async with ws_client(server.ws_url(document_id), **kwargs) as client:
        hello: dict[str, Any] = {"type": "hello", "protocol": 1, "client_id": client_id,
                                 "token": token(sub, role=role)}
        if resume is not None:
            hello["resume"] = resume
        await client.send(hello)
        welcome = await client.recv()
        assert welcome["type"] == "welcome", welcome
        yield client, welcome


class RawClient:
    """A bare RFC 6455 client on a plain socket: it reads only when told to.

    Library clients buffer incoming frames in user space; this one leaves
    them in the kernel, so the server really sees a peer that stopped reading.
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def connect(cls, port: int, path: str, rcvbuf: int = 4096) -> "RawClient":
        import base64
        import os

        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        reader, writer = await asyncio.open_connection(sock=sock, limit=16384)
        key = base64.b64encode(os.urandom(16)).decode()
        writer.write(
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        status = await reader.readline()
        if b" 101 " not in status:
            writer.close()
            await writer.wait_closed()
            raise RuntimeError(f"upgrade refused: {status!r}")
        while (await reader.readline()) not in (b"\r\n", b""):
            pass
        return cls(reader, writer)

    def send(self, message: dict[str, Any]) -> None:
        payload = orjson.dumps(message)
        header = bytearray([0x81])
        if len(payload) < 126:
            header.append(0x80 | len(payload))
        elif len(payload) < 65536:
            header.append(0x80 | 126)
            header += len(payload).to_bytes(2, "big")
        else:
            header.append(0x80 | 127)
            header += len(payload).to_bytes(8, "big")
        self.writer.write(bytes(header) + b"\x00\x00\x00\x00" + payload)  # zero mask key

    async def read_frame(self) -> tuple[int, bytes]:
        first, second = await self.reader.readexactly(2)
        length = second & 0x7F
        if length == 126:
            length = int.from_bytes(await self.reader.readexactly(2), "big")
        elif length == 127:
            length = int.from_bytes(await self.reader.readexactly(8), "big")
        return first & 0x0F, await self.reader.readexactly(length)

    async def read_until_close(self) -> tuple[list[dict[str, Any]], int | None]:
        """Every JSON text frame, then the close code (None if the stream just ended)."""
        events: list[dict[str, Any]] = []
        while True:
            try:
                opcode, payload = await self.read_frame()
            except asyncio.IncompleteReadError:
                return events, None
            if opcode == 0x1:
                events.append(orjson.loads(payload))
            elif opcode == 0x8:
                return events, int.from_bytes(payload[:2], "big") if payload else None

    def close(self) -> None:
        self.writer.close()


@contextlib.contextmanager
def logged(logger_name: str, level: int = logging.DEBUG) -> Iterator[list[str]]:
    """The messages `logger_name` logs at `level` or above while the block runs (a handler
    of its own: the app's logging setup replaces the handlers of "cowrite" itself)."""
    lines: list[str] = []
    handler = logging.Handler(level)
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger(logger_name)
    logger.addHandler(handler)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
