"""A run's timers: loop callbacks, kept by key, that report back when they fire.

The run machine names its timers ("run", "grace", "call:<id>") and arms and
disarms them through effects; the driver keeps them here, so that a timer
is one `TimerHandle` and firing one only hands its key back (the driver turns
it into an input). Re-arming a key cancels the handle it replaces.
"""

import asyncio
from collections.abc import Callable


class RunTimers:
    __slots__ = ("_fired", "_handles")

    def __init__(self, fired: Callable[[str], None]) -> None:
        self._fired = fired
        self._handles: dict[str, asyncio.TimerHandle] = {}

    def arm(self, key: str, delay_s: float) -> None:
        self.disarm(key)
        self.start(key, delay_s)

    def start(self, key: str, delay_s: float) -> None:
        """Arm `key` without looking for a handle to replace (one that just fired)."""
        self._handles[key] = asyncio.get_running_loop().call_later(delay_s, self._fire, key)

    def disarm(self, key: str) -> None:
        """Cancel `key`'s timer; "*" cancels them all."""
        keys = list(self._handles) if key == "*" else [key]
        for name in keys:
            handle = self._handles.pop(name, None)
            if handle is not None:
                handle.cancel()

    def _fire(self, key: str) -> None:
        self._handles.pop(key, None)
        self._fired(key)
