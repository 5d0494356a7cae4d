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
from collections.abc import Iterator
from typing import Any

import uvicorn
from starlette.applications import Starlette

from server.httpguard import GuardedHttpProtocol
from server.settings import Settings
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
