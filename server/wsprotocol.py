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
writer skip the ASGI layers for a frame that can be written at once.

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
