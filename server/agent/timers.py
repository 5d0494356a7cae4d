"""A run's timers: loop callbacks, kept by key, that report back when they fire.

The run machine names its timers ("run", "grace", "call:<id>", "approval:<id>") and arms and
disarms them through effects; the driver keeps them here, so that a timer
is one `TimerHandle` and firing one only hands its key back (the driver turns
it into an input). Re-arming a key cancels the handle it replaces.
"""

import asyncio
from collections.abc import Callable


class RunTimers:
    __slots__ = ("_fired", "_handles", "_loop")

    def __init__(self, fired: Callable[[str], None]) -> None:
        self._fired = fired
        self._handles: dict[str, asyncio.TimerHandle] = {}
        self._loop: asyncio.AbstractEventLoop | None = None  # a run's, looked up once

    def arm(self, key: str, delay_s: float) -> None:
        self.disarm(key)
        self.start(key, delay_s)

    def start(self, key: str, delay_s: float) -> None:
        """Arm `key` without looking for a handle to replace (one that just fired)."""
        loop = self._loop
        if loop is None:  # `get_running_loop` costs a syscall (getpid) each time
            loop = self._loop = asyncio.get_running_loop()
        self._handles[key] = loop.call_later(delay_s, self._fire, key)

    def disarm(self, key: str) -> None:
        """Cancel `key`'s timer; "*" cancels them all."""
        if key != "*":  # three a round trip: no list for one key
            handle = self._handles.pop(key, None)
            if handle is not None:
                handle.cancel()
            return
        for handle in self._handles.values():
            handle.cancel()
        self._handles.clear()

    def _fire(self, key: str) -> None:
        self._handles.pop(key, None)
        self._fired(key)
