"""Reaching under ASGI for the one thing it cannot do: abort a connection.

A close frame queued behind megabytes that a peer never reads is never
delivered, and asyncio's graceful `close()` keeps those buffers until the
peer reads or TCP gives up (zero-window probes can last for hours). So a
close gets a bounded wait and then `transport.abort()`, which frees the
buffers at once.
"""

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, runtime_checkable

logger = logging.getLogger("cowrite.transport")
TRANSPORT_KEY = "cowrite.transport"
DRAIN_POLL_S = 0.02


@runtime_checkable
class AbortableTransport(Protocol):
    """What cowrite uses of a connection's transport. A structural type, not
    `asyncio.WriteTransport`: uvloop's `TCPTransport` (what `python -m server`
    runs on) subclasses none of asyncio's transport classes, so an `isinstance`
    test against them silently turned the pre-hello frame limit, the handshake
    cap's closes and the bounded close's abort off in production."""

    def get_protocol(self) -> Any: ...
    def is_closing(self) -> bool: ...
    def get_write_buffer_size(self) -> int: ...
    def close(self) -> None: ...
    def abort(self) -> None: ...


class TransportHandle:
    """ASGI middleware: put the WebSocket's asyncio transport in the scope.

    uvicorn hands the app its protocol's bound `send`, whose object owns the
    `transport`; other servers pass through untouched (closes then stay
    bounded by their own timeouts, without an abort).

    `__call__` is a plain function returning the app's awaitable, not a
    coroutine awaiting it: no frame of its own stays alive under every open
    connection (about 250 bytes each).
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    def __call__(self, scope: Any, receive: Any, send: Any) -> Awaitable[None]:
        if scope["type"] == "websocket":
            transport = getattr(getattr(send, "__self__", None), "transport", None)
            if isinstance(transport, AbortableTransport):
                scope[TRANSPORT_KEY] = transport
        result: Awaitable[None] = self.app(scope, receive, send)
        return result


async def finish_close(close: Awaitable[None], transport: AbortableTransport | None,
                       timeout_s: float) -> None:
    """Run `close` (which writes the close frame once the transport accepts
    writes) for at most `timeout_s`; then give the written bytes as long
    again to leave the process; then abort the transport if they have not."""
    try:
        await asyncio.wait_for(close, timeout_s)
    except TimeoutError:
        pass
    except Exception:  # the peer closed first: nothing left to send
        return
    if transport is None:
        return
    for _ in range(max(1, int(timeout_s / DRAIN_POLL_S))):
        if transport.is_closing() or not transport.get_write_buffer_size():
            return
        await asyncio.sleep(DRAIN_POLL_S)
    if not transport.is_closing() and transport.get_write_buffer_size():
        logger.info("peer did not read its close frame within %.1f s; aborting", timeout_s)
        with contextlib.suppress(Exception):
            transport.abort()


def closer(scope: Mapping[str, Any], counted: Callable[[], None]) -> Callable[[], None]:
    """A callback that closes the connection of `scope` (its transport), calling `counted`
    first: how the handshake gate makes room by closing the oldest pending socket."""
    def close() -> None:
        counted()
        transport = scope.get(TRANSPORT_KEY)
        if transport is not None:
            transport.close()
    return close
