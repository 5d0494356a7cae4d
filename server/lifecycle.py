"""Draining an instance on shutdown (SIGTERM).

uvicorn by itself closes WebSockets with 1012 and only then runs the app's
lifespan shutdown. cowrite drains first: with another instance alive (Redis)
this instance's runs are handed over to it (`run.resumed` `handoff`);
otherwise they end `aborted`/`server_shutdown` (their events reach every
client). Then each
connection's writer flushes what is queued and closes with 1001 so the client
resumes on another instance.
"""

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import uvicorn

from protocol.codes import CloseCode
from server.services import Services

logger = logging.getLogger("cowrite.lifecycle")


async def drain(services: Services, timeout_s: float = 3.0) -> None:
    services.draining = services.runs.draining = True
    sessions = list(services.hub.sessions.values())
    router = services.router  # not durable (COWRITE_DURABLE_RUNS=0): 1.0's shutdown below
    router.handing_over = await router.begin_drain() and router.durable
    if router.handing_over:  # section 13: hand the runs over (later ones too, `app.py`)
        await asyncio.gather(*(session.runs.hand_over() for session in sessions),
                             return_exceptions=True)
    else:  # section 6: the last instance ends its runs server_shutdown
        await asyncio.gather(*(session.runs.shutdown() for session in sessions),
                             return_exceptions=True)
    for session in sessions:
        for conn in list(session.connections.values()):
            conn.close(CloseCode.GOING_AWAY, "server shutting down; resume on another instance")
    deadline = time.monotonic() + timeout_s
    while any(s.connections for s in services.hub.sessions.values()):
        if time.monotonic() > deadline:
            logger.warning("drain: connections still open after %.1f s", timeout_s)
            break
        await asyncio.sleep(0.02)


class DrainingServer(uvicorn.Server):
    """uvicorn.Server that drains the app before uvicorn's own shutdown."""

    def __init__(self, config: uvicorn.Config, on_shutdown: Callable[[], Awaitable[None]]
                 ) -> None:
        super().__init__(config)
        self._on_shutdown = on_shutdown

    async def shutdown(self, sockets: Any = None) -> None:
        for server in self.servers:
            server.close()  # stop accepting first
        try:
            await self._on_shutdown()
        except Exception:
            logger.exception("drain failed")
        await super().shutdown(sockets)
