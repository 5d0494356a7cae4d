"""A queue for one consumer: a list, and a future only while the consumer waits.

`asyncio.Queue` keeps three deques and an event for producers that wait and
tasks that join; a queue that is never bounded and has one reader needs none
of them. Used for the messages uvicorn hands a connection (`wsprotocol`), where
it saves memory per idle connection, and for a run driver's inputs, where it
saves work per input (two go through it per tool round trip).
"""

import asyncio
from typing import Any


class Inbox:
    """The part of `asyncio.Queue` its users call (`put_nowait`, `get`, `get_nowait`,
    `empty`), for one consumer. Both keep it short (uvicorn pauses reading once a
    message is queued; a run's inputs are decided as they come), so `pop(0)` is fine."""

    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: list[Any] = []
        self._waiter: asyncio.Future[None] | None = None

    def put_nowait(self, item: Any) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def empty(self) -> bool:
        return not self._items

    def get_nowait(self) -> Any:
        return self._items.pop(0)

    async def get(self) -> Any:
        if self._waiter is not None:
            raise RuntimeError("Inbox.get: another receive is already waiting")
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._items.pop(0)
