"""A queue for one consumer: a list, and a future only while the consumer waits.

`asyncio.Queue` keeps three deques and an event for producers that wait and
tasks that join; a queue that is never bounded and has one reader needs none
of them. Used for the messages uvicorn hands a connection (`wsprotocol`), where
it saves memory per idle connection, and (`RunInbox`) for a run driver's inputs,
where it saves work per input, and lets the sender of an input apply it itself
while the driver has nothing to do (no hop to the driver's task and back).
"""

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from server.continuation import start_eagerly


class Inbox:
    """The part of `asyncio.Queue` its users call (`put_nowait`, `get`, `get_nowait`,
    `empty`), for one consumer. Both keep it short (reading pauses once a message is
    queued: uvicorn's rule, or on `LeanSansIOProtocol`'s direct path once one is
    queued that no waiting `get` takes at once, `is_awaited`; a run's inputs are
    decided as they come), so `pop(0)` is fine."""

    __slots__ = ("_items", "_loop", "_waiter")

    def __init__(self) -> None:
        self._items: list[Any] = []
        self._waiter: asyncio.Future[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the consumer's, once known

    def put_nowait(self, item: Any) -> None:
        self._items.append(item)
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def future(self) -> "asyncio.Future[Any]":
        """A future of the consumer's loop, looked up once (each `get_running_loop` costs
        a syscall, getpid, in CPython 3.11: one per message otherwise)."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        return loop.create_future()

    def empty(self) -> bool:
        return not self._items

    def is_awaited(self) -> bool:
        """Whether the consumer waits in `get` and nothing woke it yet: the one item
        queued is as good as taken."""
        waiter = self._waiter
        return waiter is not None and not waiter.done() and len(self._items) <= 1

    def get_nowait(self) -> Any:
        return self._items.pop(0)

    async def get(self) -> Any:
        if self._waiter is not None:
            raise RuntimeError("Inbox.get: another receive is already waiting")
        while not self._items:
            self._waiter = self.future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._items.pop(0)


class Envelope:
    """An item, its sender, and how it was dealt with (`answer`, also given to the
    sender's `done` future when it waits on one)."""

    __slots__ = ("answer", "done", "event", "peer")

    def __init__(self, event: Any, peer: Any) -> None:
        self.event, self.peer = event, peer
        self.done: asyncio.Future[bool] | None = None
        self.answer: bool | None = None

    def settle(self, answer: bool) -> None:
        self.answer = answer
        done = self.done
        if done is not None and not done.done():  # a sender that stopped waiting cancelled it
            done.set_result(answer)


class RunInbox(Inbox):
    """A run driver's inputs (`Envelope`s), which a sender may apply itself, in its own
    task, while the driver waits with nothing to do (`take_turn`): a client's message
    then costs no hop to the driver's task and back. While such a turn runs the driver
    stays parked (`put_nowait` does not wake it), so one input is applied at a time, in
    order; the turn's end wakes it if something is left for it, and hands it a failure
    (`failure`), so the run ends as if the driver itself had failed."""

    __slots__ = ("_going_on", "_settle", "_turn", "failure")

    def __init__(self, settle: Callable[[Envelope], Awaitable[Any]],
                 going_on: Callable[[], bool]) -> None:
        """`settle` applies an envelope and answers it; `going_on()` is False once the
        consumer's work is over (a turn then stops and wakes it)."""
        super().__init__()
        self._settle, self._going_on = settle, going_on
        self._turn = False
        self.failure: Exception | None = None

    def put_nowait(self, item: Any) -> None:
        self._items.append(item)
        if not self._turn:
            self._wake()

    def take_turn(self, envelope: Envelope,
                  spawn: "Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]]") -> bool:
        """Apply `envelope` (`settle`), then what it queued while `going_on()`, now, in
        the calling task until the first wait, the rest in a task made by `spawn`; False,
        with nothing done, unless the consumer waits in `park` with nothing to do."""
        waiter = self._waiter
        if waiter is None or waiter.done() or self._turn or self._items:
            return False
        self._turn = True
        start_eagerly(self._run_turn(envelope), spawn)
        return True

    async def _run_turn(self, envelope: Envelope) -> None:
        settle, going_on = self._settle, self._going_on
        try:
            await settle(envelope)
            while going_on() and self._items:
                await settle(self._items.pop(0))
        except Exception as exc:
            self.failure = exc
        finally:
            self._turn = False
            if self._items or self.failure is not None or not going_on():
                self._wake()

    def refuse_all(self, current: Envelope | None) -> None:
        """Answer False to `current` (if not answered yet: its application failed) and to
        everything queued: the run is over."""
        if current is not None and current.answer is None:
            current.settle(False)
        while self._items:
            self._items.pop(0).settle(False)

    async def take(self) -> Any:
        """The next item, or None after waiting for one (the consumer then checks
        whether its work is over before it takes the next)."""
        if self._items:
            return self._items.pop(0)
        await self.park()
        return None

    async def park(self) -> None:
        """Wait until an item is queued or a turn's end wakes the consumer; raise what
        made a turn fail."""
        if self._waiter is not None:
            raise RuntimeError("RunInbox.park: another receive is already waiting")
        self._waiter = self.future()
        try:
            await self._waiter
        finally:
            self._waiter = None
        if self.failure is not None:
            raise self.failure
