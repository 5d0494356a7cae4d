"""uvicorn's httptools protocol with a bound on a request's head: its size and its time.

Every connection, WebSocket or not, starts as an HTTP request read by
uvicorn's `HttpToolsProtocol`, which bounds neither: httptools buffers a
header line of any length (a 1 MB header was read and answered), and a
connection that sends half a request head is held until the client goes (a
few bytes every minute keep it forever). `GuardedHttpProtocol` answers 431
once a head passes `HEAD_MAX_BYTES` and 408 when a head has not completed
within `HEAD_TIMEOUT_S` of its first byte (of the connection, for the first
request), then closes. Bodies are not its business (each route bounds its own
body), and neither is the time between requests (uvicorn's keep-alive timeout).
"""

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

HEAD_MAX_BYTES = 65_536
"""The largest request line plus headers: 8x what browsers send with a long cookie."""

HEAD_TIMEOUT_S = 10.0
"""How long a request head may take to arrive: a slow client on a bad link needs well
under a second for a few KB; a client sending a byte a minute is holding a slot."""

LINGER_S = 2.0
"""How long a refused connection stays open, its input dropped, for the answer to be read."""


def _answer(status: bytes, reason: str) -> bytes:
    body = reason.encode("ascii")
    return b"".join((b"HTTP/1.1 ", status, b"\r\ncontent-type: text/plain; charset=utf-8\r\n",
                     b"content-length: ", str(len(body)).encode("ascii"),
                     b"\r\nconnection: close\r\n\r\n", body))


HEAD_TOO_LARGE = _answer(b"431 Request Header Fields Too Large",
                         f"request head larger than {HEAD_MAX_BYTES} bytes")
HEAD_TOO_SLOW = _answer(b"408 Request Timeout",
                        f"request head not received within {HEAD_TIMEOUT_S:g} s")


class GuardedHttpProtocol(HttpToolsProtocol):
    """The `http` protocol class cowrite gives uvicorn (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_bytes: int | None = 0  # None: no head is being read
        self._head_timer: asyncio.TimerHandle | None = None
        self._refused = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._start_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        super().data_received(data)
        if self._head_bytes is not None and self.transport.get_protocol() is self:
            self._head_bytes += len(data)
            if self._head_bytes > HEAD_MAX_BYTES:
                self._refuse(HEAD_TOO_LARGE)

    def on_message_begin(self) -> None:
        """The first byte of a request (the next one on a kept-alive connection)."""
        self._start_head()
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._head_bytes = None
        self._stop_head_timer()
        super().on_headers_complete()

    def _start_head(self) -> None:
        if self._head_bytes is None:
            self._head_bytes = 0
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(HEAD_TIMEOUT_S, self._head_timed_out)

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._head_bytes is not None and self.transport.get_protocol() is self:
            self._refuse(HEAD_TOO_SLOW)

    def _refuse(self, answer: bytes) -> None:
        """Answer, then close once the client has had time to read it. The parser
        is spent (it stopped mid-head), so what still arrives is dropped: closing
        at once with unread bytes in the socket makes the kernel reset the
        connection, and a client still sending its head never saw the answer."""
        self._head_bytes = None
        self._stop_head_timer()
        transport = self.transport
        if transport.is_closing():
            return
        self._refused = True
        transport.write(answer)
        if transport.can_write_eof():
            transport.write_eof()
        self.loop.call_later(LINGER_S, transport.close)

