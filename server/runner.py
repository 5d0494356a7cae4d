"""The uvicorn configuration cowrite runs with, shared by `make run` and the tests.

`websockets-sansio` was the fastest uvicorn WebSocket implementation on these
machines and honours the ping settings; it runs as `LeanSansIOProtocol`
(server/wsprotocol.py: the same protocol holding less per idle connection).
Request heads are bounded in size and time
(server/httpguard.py). permessage-deflate is off (CPU on tiny frames, compression bombs). uvicorn's
own frame cap sits above ours so a too-large frame normally gets our
`too_large` error before close 1009.
"""

import asyncio
import contextlib
import socket
from collections.abc import Iterator
from typing import Any

import uvicorn
from starlette.applications import Starlette

from server.httpguard import GuardedHttpProtocol
from server.settings import Settings
from server.startup_errors import StartupError
from server.wsprotocol import LeanSansIOProtocol, frame_limit


def uvicorn_config(app: Starlette, settings: Settings, **overrides: Any) -> uvicorn.Config:
    options: dict[str, Any] = {
        "host": settings.host,
        "port": settings.port,
        "http": GuardedHttpProtocol,
        "ws": LeanSansIOProtocol,
        "ws_max_size": frame_limit(settings.max_message_bytes),
        "ws_ping_interval": settings.heartbeat_s,
        "ws_ping_timeout": settings.heartbeat_s * 2,
        "ws_per_message_deflate": False,
        "lifespan": "on",
        "log_level": "warning",
        "access_log": False,
        "timeout_graceful_shutdown": 5,
    }
    options.update(overrides)
    return uvicorn.Config(app, **options)


def metrics_config(app: Starlette, settings: Settings) -> uvicorn.Config:
    """The `COWRITE_METRICS_PORT` listener: plain HTTP, same host, no lifespan."""
    return uvicorn.Config(app, host=settings.host, port=settings.metrics_port or 0,
                          http=GuardedHttpProtocol, lifespan="off", log_level="warning",
                          access_log=False, ws="none", timeout_graceful_shutdown=1)


def bind_listeners(host: str, port: int, variable: str) -> list[socket.socket]:
    """Listening sockets for `port` on every address of `host` (as asyncio's
    `create_server` binds them), bound before anything starts: a port in use stops the
    start in one line naming `variable`. Bound by uvicorn, a busy port was uvicorn's
    own log line and `sys.exit(3)` (the metrics port's, inside the lifespan, an 81-line
    traceback)."""
    listeners: list[socket.socket] = []
    try:
        found = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
        for family, kind, proto, _, address in dict.fromkeys(found):
            try:
                listener = socket.socket(family, kind, proto)
            except OSError:  # a family this machine lacks (IPv6 off): asyncio skips it too
                continue
            listeners.append(listener)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            listener.bind(address)
    except OSError as exc:
        close_all(listeners)
        reason = exc.strerror or "cannot bind"
        raise StartupError(f"{variable}: cannot listen on that port of COWRITE_HOST "
                           f"({reason}): free it or choose another port") from None
    if not listeners:
        raise StartupError(f"{variable}: no address of COWRITE_HOST to listen on")
    return listeners


def bind_metrics(settings: Settings) -> list[socket.socket]:
    """The `COWRITE_METRICS_PORT` listeners (none when it is unset)."""
    if settings.metrics_port is None:
        return []
    return bind_listeners(settings.host, settings.metrics_port, "COWRITE_METRICS_PORT")


def close_all(listeners: list[socket.socket]) -> None:
    for listener in listeners:
        listener.close()


class MetricsServer(uvicorn.Server):
    """A second uvicorn server inside the main one's event loop (started by the
    main app's lifespan). It leaves signals to the main server: its own
    `capture_signals` would take SIGTERM away from the draining logic."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def wait_started(self, task: "asyncio.Task[None]") -> None:
        while not self.started:
            if task.done():
                task.result()  # a bind failure (port in use) surfaces here
                raise RuntimeError("the metrics listener did not start")
            await asyncio.sleep(0.01)
