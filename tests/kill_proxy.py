"""TCP proxies in front of a redis-server that fail the instance using them at the
moment it sends a command containing a marker: `KillProxy` SIGKILLs it (a crash at an
exact point of a run, e.g. as it logs a `tool.call`), `DropReplyProxy` lets the
command run and drops its reply (a connection lost after Redis acted). No timing
could hit either point reliably."""

import asyncio
import contextlib
import os
import signal

from tests.harness import free_port


class KillProxy:
    def __init__(self, redis_port: int, marker: bytes, after: bool = False) -> None:
        """`after`: the marked command reaches Redis first, then the kill."""
        self.redis_port, self.marker, self.after = redis_port, marker, after
        self.port = free_port()
        self.pid: int | None = None  # armed once set
        self.fired = asyncio.Event()
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def __aenter__(self) -> "KillProxy":
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        return self

    async def __aexit__(self, *_: object) -> None:
        if self._server is not None:
            self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
                     ) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.redis_port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(self._pipe(reader, up_writer, watch=True),
                             self._pipe(up_reader, writer, watch=False),
                             return_exceptions=True)

    async def _pipe(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter,
                    watch: bool) -> None:
        tail = b""
        try:
            while data := await source.read(65536):
                if self.fired.is_set():
                    return
                if watch and self.pid is not None and self.marker in tail + data:
                    if self.after:
                        sink.write(data)
                        await sink.drain()
                        await asyncio.sleep(0.05)  # executed by Redis, its answer unread
                    os.kill(self.pid, signal.SIGKILL)
                    self.fired.set()
                    return
                tail = (tail + data)[-len(self.marker):]
                sink.write(data)
                await sink.drain()
        finally:
            with contextlib.suppress(Exception):
                sink.close()


class DropReplyProxy:
    """Once `armed`, the first command containing `marker` reaches Redis, then its
    connection is cut before the reply comes back."""

    def __init__(self, redis_port: int, marker: bytes) -> None:
        self.redis_port, self.marker = redis_port, marker
        self.port = free_port()
        self.armed = False
        self.fired = asyncio.Event()
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def __aenter__(self) -> "DropReplyProxy":
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        return self

    async def __aexit__(self, *_: object) -> None:
        if self._server is not None:
            self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
                     ) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.redis_port)
        except OSError:
            writer.close()
            return
        cut = asyncio.Event()

        async def up() -> None:
            tail = b""
            while data := await reader.read(65536):
                if self.armed and not self.fired.is_set() and self.marker in tail + data:
                    self.fired.set()
                    cut.set()
                tail = (tail + data)[-len(self.marker):]
                up_writer.write(data)
                await up_writer.drain()

        async def down() -> None:
            while data := await up_reader.read(65536):
                if cut.is_set():  # the marked command ran; its reply never arrives
                    writer.transport.abort()
                    up_writer.transport.abort()
                    return
                writer.write(data)
                await writer.drain()

        await asyncio.gather(up(), down(), return_exceptions=True)
        for stream in (writer, up_writer):
            with contextlib.suppress(Exception):
                stream.close()
