"""Finishing a coroutine in another task than the one that started it.

A WebSocket send normally completes without ever waiting, so the publisher
of an event can run it to completion on the spot (`coroutine.send(None)`);
when it does have to wait, the coroutine is suspended on a future, and the
connection's writer task finishes it by awaiting a `Continuation`, which
passes that future to the writer's task and resumes the coroutine exactly as
a task would have (a cancellation of the writer is thrown into it).
"""

import asyncio
from collections.abc import Callable, Coroutine, Generator
from typing import Any


class Continuation:
    """Awaiting this finishes, in the awaiting task, a coroutine that was started
    elsewhere and is suspended on `waiting` (what it yielded to the loop)."""

    __slots__ = ("_coro", "_waiting")

    def __init__(self, coro: Coroutine[Any, Any, Any], waiting: Any) -> None:
        self._coro, self._waiting = coro, waiting

    def __await__(self) -> Generator[Any, Any, None]:
        coro, waiting = self._coro, self._waiting
        while True:
            try:
                value = yield waiting
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # the awaiting task was cancelled: tell the send
                try:
                    waiting = coro.throw(exc)
                except StopIteration:
                    return
            else:
                try:
                    waiting = coro.send(value)
                except StopIteration:
                    return


class _Rest(Coroutine[Any, Any, None]):
    """The rest of a coroutine suspended on `waiting`, as a task's coroutine. Not an
    `async def` that awaits a `Continuation`: a task cancelled before its first step
    never runs such a wrapper, so the cancel never reached the coroutine, which was
    dropped where it waited (an `async for` suspended in its generator's `__anext__`
    left the generator "running": collected, it logged "Task exception was never
    retrieved ... aclose(): asynchronous generator is already running"). Here the
    task's first step gets `waiting`, and every throw, that early cancel too, goes
    into the coroutine where it waits, as if it had been the task's all along."""

    __slots__ = ("_coro", "_first")

    def __init__(self, coro: Coroutine[Any, Any, None], waiting: Any) -> None:
        self._coro = coro
        self._first: list[Any] | None = [waiting]  # until the task's first step takes it

    def send(self, value: Any) -> Any:
        first = self._first
        if first is not None:
            self._first = None
            return first[0]
        return self._coro.send(value)

    def throw(self, *exc: Any) -> Any:
        first, self._first = self._first, None
        if first is not None:  # cancelled before its first step: as a task cancelled while
            cancel = getattr(first[0], "cancel", None)  # it waits cancels what it waits on
            if cancel is not None:
                cancel()
        return self._coro.throw(*exc)

    def close(self) -> None:
        self._coro.close()

    # What a task's repr and `get_stack` read (the hang report prints them): the
    # coroutine's own, not an anonymous "<_Rest without __name__>" with no stack.
    @property
    def __name__(self) -> str:
        return str(getattr(self._coro, "__qualname__", type(self._coro).__name__))

    @property
    def cr_frame(self) -> Any:
        return getattr(self._coro, "cr_frame", None)

    @property
    def cr_await(self) -> Any:
        return getattr(self._coro, "cr_await", None)

    @property
    def cr_running(self) -> bool:
        return bool(getattr(self._coro, "cr_running", False))

    def __await__(self) -> Generator[Any, Any, None]:
        if self._first is None:
            raise RuntimeError("already resumed")
        waiting, self._first = self._first[0], None
        return Continuation(self._coro, waiting).__await__()


def start_eagerly(coroutine: Coroutine[Any, Any, None],
                  spawn: "Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]]"
                  ) -> "asyncio.Task[None] | None":
    """Run `coroutine` in the calling task until it first waits, then hand the rest to a
    task made by `spawn` (as 3.12's eager tasks do); None when it never waited. Not for a
    coroutine that enters `asyncio.timeout` before its first wait: the timeout would
    bind to the calling task."""
    try:
        waiting = coroutine.send(None)
    except StopIteration:
        return None
    return spawn(_Rest(coroutine, waiting))
