"""uvicorn's `websockets-sansio` protocol, with less held per open connection.

Most connections of a server idle, so what each holds while idle is the
server's memory. uvicorn's protocol object gives every connection an
`asyncio.Queue` for received messages (three deques and an Event with a
fourth: CPython allocates each deque's first 64-slot block at once, ~3 KB
together) and an `asyncio.Event` for write backpressure (a fifth deque), and
keeps the handshake's response (its headers) for the connection's life.
`LeanSansIOProtocol` swaps the queue and the event for `Inbox` and `Flag`,
which offer the methods uvicorn calls with a list or a future only while
someone waits, and drops the response once the handshake is done. Nothing
else changes: frames, limits, pings, pause/resume of reading and writing are
uvicorn's own code (measured: 31.7 -> 24.7 KiB per idle connection,
`python -m bench.run --idle-memory`). `send_text_now` lets the connection's
writer skip the ASGI layers for a frame that can be written at once, and
`data_received` hands the app a read of whole text messages without
websockets' parser (`server.wsframes`); a single message the app already waits
for does not pause reading (uvicorn pauses after every message and resumes
once the app takes it: two `epoll_ctl` calls per message, for nothing).

The swap depends on uvicorn's attribute names, so each part is applied only
when the attribute has the type expected (an `asyncio.Queue`, an
`asyncio.Event`); a uvicorn that changed them runs unchanged, as stock.
"""

import asyncio
import contextlib
from typing import Any

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.exceptions import InvalidState
from websockets.protocol import Side, State
from websockets.server import ServerProtocol

from server.inbox import Inbox as Inbox  # re-exported: it was defined here
from server.wsframes import FrameCursor, text_messages

_SHORT_HEADS = [bytes((0x81, length)) for length in range(126)]


def append_text_frame(conn: ServerProtocol, data: bytes) -> None:
    """`conn.send_text(data)`, with the same bytes, in a few operations instead of
    websockets' general `Frame.serialize` (a frame object, its checks, a BytesIO,
    struct): a server's unmasked, unfragmented text frame with no extension.
    Anything else (an extension, a fragmented message in progress, debug
    logging, a connection not open) goes through `send_text` itself."""
    if conn.extensions or conn.expect_continuation_frame or conn.debug or \
            conn.state is not State.OPEN:
        conn.send_text(data)
        return
    length = len(data)
    if length < 126:
        head = _SHORT_HEADS[length]
    elif length < 65536:
        head = b"\x81\x7e" + length.to_bytes(2, "big")
    else:
        head = b"\x81\x7f" + length.to_bytes(8, "big")
    conn.writes.append(head + data)


def _fast_frames_fit() -> bool:
    """Whether this websockets keeps what `append_text_frame` reads and writes."""
    conn = ServerProtocol()
    return conn.side is Side.SERVER and all(
        hasattr(conn, name) for name in ("extensions", "expect_continuation_frame", "debug",
                                         "writes", "state"))


FAST_FRAMES = _fast_frames_fit()


class Flag:
    """`asyncio.Event` (`set`, `clear`, `is_set`, `wait`) whose waiters, the
    sends blocked while the transport's buffer is full, get a list only when
    there are some."""

    __slots__ = ("_value", "_waiters")

    def __init__(self, value: bool = False) -> None:
        self._value = value
        self._waiters: list[asyncio.Future[None]] | None = None

    def is_set(self) -> bool:
        return self._value

    def set(self) -> None:
        if self._value:
            return
        self._value = True
        waiters, self._waiters = self._waiters, None
        for waiter in waiters or ():
            if not waiter.done():
                waiter.set_result(None)

    def clear(self) -> None:
        self._value = False

    async def wait(self) -> bool:
        if self._value:
            return True
        waiter = asyncio.get_running_loop().create_future()
        waiters = self._waiters
        if waiters is None:
            waiters = self._waiters = []
        waiters.append(waiter)
        try:
            await waiter
        finally:
            with contextlib.suppress(ValueError):  # gone when `set` woke it
                waiters.remove(waiter)
        return True


class LeanSansIOProtocol(WebSocketsSansIOProtocol):
    """The `ws` protocol class cowrite gives uvicorn (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if type(self.queue) is asyncio.Queue:
            self.queue = Inbox()  # type: ignore[assignment]  # the methods uvicorn calls
        if type(self.writable) is asyncio.Event:
            self.writable = Flag(self.writable.is_set())  # type: ignore[assignment]
        # Frame boundaries of what the client sent, known only when the upgrade
        # request came alone in the first read (see `data_received`); None: websockets
        # reads everything.
        self._cursor: FrameCursor | None = None
        self._first_read = True
        self._asgi_app = self.app
        self.app = self._serve

    async def _serve(self, scope: Any, receive: Any, send: Any) -> None:
        """The app, and a refusal sent as an HTTP response (403, 404, 503) counted as a
        finished handshake: uvicorn leaves that flag unset on this path and logged
        "ASGI callable returned without completing handshake" at ERROR for each one."""
        await self._asgi_app(scope, receive, send)
        if self.initial_response is not None and self.close_sent:
            self.handshake_complete = True

    def data_received(self, data: bytes) -> None:
        """A read that is nothing but whole text messages, arriving where websockets'
        parser waits at a frame boundary with nothing buffered, goes to the app
        without that parser (`server.wsframes`: same messages, less work); any
        other read goes to uvicorn as before. The boundary is known only if the
        first read was the whole upgrade request and nothing else (one write, as
        clients send it): a request cut across reads, or bytes after it before the
        handshake completed, leave the connection on the general path."""
        cursor = self._cursor
        if cursor is not None and self.handshake_complete:
            if cursor.at_boundary() and self._read_directly(data):
                return
            cursor.advance(data)
        elif self._first_read:
            self._first_read = False
            super().data_received(data)
            if self.conn.handshake_exc is not None and not self.handshake_initiated:
                self._refuse_request()
                return
            if FAST_FRAMES and self.handshake_initiated and not self.handshake_complete \
                    and data.find(b"\r\n\r\n") == len(data) - 4 and not self.conn.reader.buffer:
                self._cursor = FrameCursor()
            return
        elif not self.handshake_complete:
            self._cursor = None  # a frame before the handshake completed: websockets reads
        super().data_received(data)

    def _refuse_request(self) -> None:
        """An upgrade request websockets would not parse (a header line over 8 KiB, over
        128 headers): websockets queued its answer (431, or nothing for garbage) but
        uvicorn writes only for a parsed request, so the client waited forever."""
        self.handshake_complete = self.close_sent = True
        self.transport.write(b"".join(self.conn.data_to_send()))
        self.transport.close()

    def _read_directly(self, data: bytes) -> bool:
        """Hand the app the messages of `data` if `text_messages` can read all of it
        (what uvicorn's `send_receive_event_to_app` does with each); False, having
        done nothing, when websockets must read it."""
        conn = self.conn
        if self.close_sent or conn.state is not State.OPEN or conn.extensions or conn.debug \
                or conn.current_size is not None or conn.reader.buffer:
            return False
        messages = text_messages(data, conn.max_message_size)
        if messages is None:
            return False
        queue = self.queue
        taken = len(messages) == 1 and isinstance(queue, Inbox) and queue.is_awaited()
        for text in messages:
            queue.put_nowait({"type": "websocket.receive", "text": text})
        if not self.read_paused and not taken:
            self.read_paused = True  # uvicorn's backpressure: one message at a time,
            self.transport.pause_reading()  # unless the app already waits for it
        return True

    def send_text_now(self, text: str) -> bool:
        """Write a text frame at once, as uvicorn's ASGI `send` would with nothing to
        wait for: handshake done, no close sent, nothing disconnected, the transport
        writable. The ASGI path (Starlette's state checks, its exception wrapper,
        uvicorn's message dispatch) costs more than the frame's own encoding, and a
        tool round trip writes three. False, having written nothing: the caller goes
        through `send`, which waits for the transport or raises what it raises."""
        if not self.handshake_complete or self.disconnected or self.close_sent \
                or self.initial_response is not None or not self.writable.is_set():
            return False
        data = text.encode()
        try:
            if FAST_FRAMES:
                append_text_frame(self.conn, data)
            else:
                self.conn.send_text(data)
        except InvalidState:  # raised before anything is written
            return False
        self.transport.write(b"".join(self.conn.data_to_send()))
        return True

    def start_keepalive(self) -> None:
        """uvicorn calls this once, as the last step of completing the
        handshake: the response is not read again after it."""
        super().start_keepalive()
        if getattr(self, "response", None) is not None:
            self.response = None  # type: ignore[assignment]


HELLO_MAX_BYTES = 65_536
"""The largest first message of a document socket: a `hello` (a JWT and a resume point)."""


def frame_limit(max_message_bytes: int) -> int:
    """The largest message uvicorn's protocol takes (a JSON frame of `max_message_bytes`
    characters, each up to 4 bytes of UTF-8, and some envelope)."""
    return max_message_bytes * 4 + 4096


def limit_messages(transport: Any, size: int) -> None:
    """The largest message the connection accepts from now on. The document socket holds
    it to `HELLO_MAX_BYTES` until the hello has passed: before that nobody is known, and
    256 handshaking sockets (the handshake cap) each filling a 4 MiB frame held ~1 GB. A
    larger message fails the connection (1009), as websockets does past any limit."""
    protocol = transport.get_protocol() if transport is not None else None
    if isinstance(protocol, LeanSansIOProtocol):
        protocol.conn.max_message_size = size
