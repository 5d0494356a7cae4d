"""Per-connection waiting that costs little memory while a connection idles.

An idle connection is most of a server's connections, so what each one holds
while waiting counts: `first_done` waits for the first of the reader and
writer tasks with one future, and `ExpiryTimer` closes a connection whose
token expires with a loop timer instead of a sleeping task.
"""

import asyncio
import time
from typing import Any

from protocol.codes import CloseCode
from server.connection import Connection


async def first_done(*tasks: "asyncio.Task[Any]") -> list["asyncio.Task[Any]"]:
    """The tasks done once the first of them ends (`asyncio.wait` with
    FIRST_COMPLETED, for less memory per idle connection: one future and a
    callback per task instead of wait's sets, callbacks and its own future)."""
    ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def on_done(_: "asyncio.Task[Any]") -> None:
        if not ended.done():
            ended.set_result(None)

    for task in tasks:
        task.add_done_callback(on_done)
    try:
        await ended
    finally:
        for task in tasks:
            task.remove_done_callback(on_done)
    return [task for task in tasks if task.done()]


class ExpiryTimer:
    """Close 4001 when the connection's token expires without a refresh.

    A loop timer rather than a task that sleeps: an idle connection then holds
    one `TimerHandle` (about 100 bytes) instead of a task, its coroutine, an
    Event and `wait_for`'s inner task. `arm` again after each refresh."""

    __slots__ = ("_conn", "_handle")
    LONGEST_S = 86_400.0  # far-off expiries re-check daily (event loops cap timer delays)

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._handle: asyncio.TimerHandle | None = None
        self.arm()

    def arm(self) -> None:
        self.cancel()
        delay = self._conn.principal.expires_at - time.time()
        if delay <= 0:
            self._conn.close(CloseCode.UNAUTHENTICATED, "token expired")
            return
        self._handle = asyncio.get_running_loop().call_later(
            min(delay, self.LONGEST_S), self.arm)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
