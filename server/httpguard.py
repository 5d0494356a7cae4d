"""uvicorn's httptools protocol with a bound on a request's head (its size and its
time) and on a connection held by a body nobody reads.

Every connection, WebSocket or not, starts as an HTTP request read by
uvicorn's `HttpToolsProtocol`, which bounds neither: httptools buffers a
header line of any length (a 1 MB header was read and answered), and a
connection that sends half a request head is held until the client goes (a
few bytes every minute keep it forever). `GuardedHttpProtocol` answers 431
once a head passes `HEAD_MAX_BYTES` and 408 when a head has not completed
within `HEAD_TIMEOUT_S` of its first byte (of the connection, for the first
request; bytes between requests, the empty lines the parser skips, start the
next head's time), then closes.

The size is exact: the parser is given no more of a head than the limit
allows (it was counted after each read, and a head that ended inside the read
crossing the limit was served: heads up to 128 KiB were). Reads are fed in
pieces of at most `FEED_BYTES`, a head being counted from the start of the
piece it begins in: exact for a head at the start of a read, and at most
`FEED_BYTES` too many for a pipelined head following another request's body.

A body is each route's business (each bounds its own size and time), but one
still arriving after its request was answered (a 401 before the body, a 413,
a route that reads none) is read by no one: uvicorn cancels its keep-alive
timer on every byte and never ends such a request, so a body trickled a byte
every few seconds held the connection for ever (240 of them took every file
descriptor). When an answer completes before its request's body, the
connection is closed the way a refused head is (after `LINGER_S`, its input
dropped). The time between requests is uvicorn's keep-alive timeout.

A refusal of a pipelined head (one sent while the answer before it is still
being written, a stream say) waits for that answer's end: it was written into
the stream, whose next write then raised in the app (write after write_eof).
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

FEED_BYTES = 8_192
"""The most bytes of a read the parser is given at once (see the module docstring)."""


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
        self._in_message = False  # between a request's first byte and its body's end
        self._refused = False  # what arrives is dropped: answered, closing
        self._deferred: bytes | None = None  # a refusal written once the answer under way ends

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._start_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        start = 0
        while start < len(data) and not self._refused:
            if self._head_bytes is None and not self._in_message:
                self._start_head()  # the empty lines before a request line are its head's
            room = FEED_BYTES if self._head_bytes is None else \
                min(FEED_BYTES, HEAD_MAX_BYTES - self._head_bytes)
            piece = data[start:start + room] if start or len(data) > room else data
            start += len(piece)
            super().data_received(piece)
            transport = self.transport
            if transport.get_protocol() is not self or transport.is_closing() or \
                    self.parser.should_upgrade():
                return  # a WebSocket now, a 400, or an upgrade uvicorn ignores the rest of
            if self._head_bytes is not None:
                self._head_bytes += len(piece)
                if self._head_bytes >= HEAD_MAX_BYTES:  # and still no end: at least one more
                    self._refuse(HEAD_TOO_LARGE)

    def on_message_begin(self) -> None:
        """The first byte of a request (the next one on a kept-alive connection)."""
        self._in_message = True
        self._start_head()
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._head_bytes = None
        self._stop_head_timer()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._in_message = False
        super().on_message_complete()

    def on_response_complete(self) -> None:
        """An answer has been written. A refusal that waited for it is written now. When
        its request's body has not all arrived, no one will read the rest: the connection
        is closed after `LINGER_S`, the rest dropped (the client reads the answer
        meanwhile), as a refused head's is."""
        cycle = self.cycle
        unread = cycle.response_complete and cycle.more_body  # not a pipelined request's
        super().on_response_complete()  # counts the request and resumes reading
        if self.transport.is_closing() or not (unread or self._deferred is not None):
            return
        self._unset_keepalive_if_required()
        if self._deferred is not None:
            self.transport.write(self._deferred)
            self._deferred = None
        self._linger()

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
        is spent (it stopped mid-head), so what still arrives is dropped. A head
        pipelined behind an answer still under way is answered after it."""
        self._head_bytes = None
        self._stop_head_timer()
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            self._refused, self._deferred = True, answer
            return
        self.transport.write(answer)
        self._linger()

    def _linger(self) -> None:
        """End the answer and close `LINGER_S` later, dropping what arrives meanwhile:
        closing at once with unread bytes in the socket makes the kernel reset the
        connection, and a client still sending never sees the answer."""
        self._refused = True
        self._stop_head_timer()
        transport = self.transport
        if transport.can_write_eof():
            transport.write_eof()
        self.loop.call_later(LINGER_S, transport.close)
