"""TCP proxies in front of a redis-server that fail the instance using them at the
moment it sends a command containing a marker: `KillProxy` SIGKILLs it (a crash at an
exact point of a run, e.g. as it logs a `tool.call`), `DropReplyProxy` lets the
command run and drops its reply (a connection lost after Redis acted),
`DelayReplyProxy` holds its reply back. No timing could hit any of these points
reliably."""

import asyncio
import contextlib
import os
import signal

from tests.harness import free_port


class _Proxy:
    """Forwards every connection to Redis; a subclass decides what the marker does."""

    silent_once_fired = False  # forward no more replies once the marker was seen

    def __init__(self, redis_port: int, marker: bytes) -> None:
        self.redis_port, self.marker = redis_port, marker
        self.port = free_port()
        self.fired = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._streams: set[asyncio.StreamWriter] = set()  # both ends of every connection

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def __aenter__(self) -> "_Proxy":
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        return self

    async def __aexit__(self, *_: object) -> None:
        """Closes what is still open too: a connection's pipes left running when the
        test's loop closed left their sockets to the collector, whose ResourceWarning
        then failed whichever later test it fell in (seen once in CI)."""
        if self._server is not None:
            self._server.close()
        for stream in list(self._streams):
            stream.transport.abort()
        self._streams.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
                     ) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.redis_port)
        except OSError:
            writer.close()
            return
        cut = asyncio.Event()  # the marked command ran: its reply never comes back
        self._streams.update((writer, up_writer))
        try:
            await asyncio.gather(self._up(reader, up_writer, cut),
                                 self._down(up_reader, writer, up_writer, cut),
                                 return_exceptions=True)
        finally:  # a cancel too
            for stream in (writer, up_writer):
                self._streams.discard(stream)
                with contextlib.suppress(Exception):
                    stream.close()

    def _armed(self) -> bool:
        raise NotImplementedError

    async def _on_marker(self, data: bytes, sink: asyncio.StreamWriter,
                         cut: asyncio.Event) -> bool:
        """What the marked command does; True when it was forwarded."""
        raise NotImplementedError

    async def _up(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter,
                  cut: asyncio.Event) -> None:
        tail = b""
        while data := await source.read(65536):
            if self._armed() and not self.fired.is_set() and self.marker in tail + data:
                self.fired.set()
                if not await self._on_marker(data, sink, cut):
                    return
                continue
            tail = (tail + data)[-len(self.marker):]
            sink.write(data)
            await sink.drain()

    async def _down(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter,
                    upstream: asyncio.StreamWriter, cut: asyncio.Event) -> None:
        while data := await source.read(65536):
            if cut.is_set():
                sink.transport.abort()
                upstream.transport.abort()
                return
            if self.fired.is_set() and self.silent_once_fired:
                return  # the instance is dead: nothing more for it
            sink.write(data)
            await sink.drain()


class KillProxy(_Proxy):
    """SIGKILLs `pid` (once set) as it sends the marked command: before the command
    reaches Redis, or just after (`after`)."""

    silent_once_fired = True

    def __init__(self, redis_port: int, marker: bytes, after: bool = False) -> None:
        super().__init__(redis_port, marker)
        self.after = after
        self.pid: int | None = None  # armed once set

    async def __aenter__(self) -> "KillProxy":
        await super().__aenter__()
        return self

    def _armed(self) -> bool:
        return self.pid is not None

    async def _on_marker(self, data: bytes, sink: asyncio.StreamWriter,
                         cut: asyncio.Event) -> bool:
        if self.after:
            sink.write(data)
            await sink.drain()
            await asyncio.sleep(0.05)  # executed by Redis, its answer unread
        assert self.pid is not None
        os.kill(self.pid, signal.SIGKILL)
        return False


class DropReplyProxy(_Proxy):
    """Once `armed`, the first command containing the marker reaches Redis, then its
    connection is cut before the reply comes back."""

    def __init__(self, redis_port: int, marker: bytes) -> None:
        super().__init__(redis_port, marker)
        self.armed = False

    async def __aenter__(self) -> "DropReplyProxy":
        await super().__aenter__()
        return self

    def _armed(self) -> bool:
        return self.armed

    async def _on_marker(self, data: bytes, sink: asyncio.StreamWriter,
                         cut: asyncio.Event) -> bool:
        cut.set()
        sink.write(data)
        await sink.drain()
        return True


class DelayReplyProxy(DropReplyProxy):
    """Once `armed`, the first command containing the marker reaches Redis; the replies
    on its connection are held until `release` is set (a slow reply: the write is done,
    its writer does not know yet)."""

    def __init__(self, redis_port: int, marker: bytes) -> None:
        super().__init__(redis_port, marker)
        self.release = asyncio.Event()

    async def __aenter__(self) -> "DelayReplyProxy":
        await super().__aenter__()
        return self

    async def _on_marker(self, data: bytes, sink: asyncio.StreamWriter,
                         cut: asyncio.Event) -> bool:
        cut.set()  # on this connection: replies wait for `release`
        sink.write(data)
        await sink.drain()
        return True

    async def _down(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter,
                    upstream: asyncio.StreamWriter, cut: asyncio.Event) -> None:
        while data := await source.read(65536):
            if cut.is_set():
                await self.release.wait()
            sink.write(data)
            await sink.drain()
