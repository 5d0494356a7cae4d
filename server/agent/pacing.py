"""Fair turns for model streams while the event loop is behind.

One event loop serves every connection, so its lag is everyone's latency:
a new run's `run.started` and first delta, an abort, a tool result each wait
for the loop to get round to them. Under load most of the loop's work is
the deltas of runs that are already streaming (1,000 streams at 50 pieces a
second is 50,000 wake-ups a second), and asyncio serves ready work first in,
first out, so a new run's first step waited behind all of them.

`Turns` watches the loop with one probe timer (every `PROBE_S`, only while
streams publish). While the probe wakes more than `BEHIND_S` late and the
streams are many (at least `CROWD` deltas since the last probe, or streams
waiting: a few streams are never what holds the loop up, and a test's lone
stream on a busy machine is never slowed down), a stream
that has just published a delta waits before it reads its next chunk: for
`HOLD_PER_LAG` times the lag, at most `MAX_HOLD_S`, released in the order
they stopped and at most `RELEASE_MAX` per probe (so the streams that waited
do not all come back in one long loop iteration). Nothing else waits: the
first delta of each model call goes out at once, and so do `run.started`,
tool calls and results, aborts and every other event. A stream that waited
finds more of its text ready (a real upstream keeps writing into the socket;
the scripted model with `catch_up`), so its text goes out in fewer, larger
deltas (merged before they are logged, so replay is the same) and the loop's
work shrinks while it is behind instead of growing. While the loop keeps up
nothing waits, and no delta is delayed.
"""

import asyncio
import weakref
from collections import deque

PROBE_S = 0.005
BEHIND_S = 0.004
HOLD_PER_LAG = 5.0
MAX_HOLD_S = 0.25
RELEASE_MAX = 100
CROWD = 50
IDLE_PROBES = 20  # probes without a delta before the probe stops (100 ms)


class Turns:
    """One event loop's fair-turn gate (see the module docstring). It holds no
    reference to the loop itself, so the loop can go when its last stream has."""

    __slots__ = ("_deltas", "_expected", "_idle", "_probing", "_waiting", "behind", "lag")

    def __init__(self) -> None:
        self._waiting: deque[tuple[float, asyncio.Future[None]]] = deque()
        self._probing = False
        self._expected = 0.0
        self._deltas = 0  # since the last probe
        self._idle = 0
        self.behind = False
        self.lag = 0.0

    def after_delta(self) -> "asyncio.Future[None] | None":
        """Called by a stream that has just published a delta: None to go on at
        once, or a future to wait on before reading the next chunk."""
        self._deltas += 1
        if not self._probing:
            self._probe(asyncio.get_running_loop())
            return None
        if not self.behind:
            return None
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._waiting.append((loop.time(), future))
        return future

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def _probe(self, loop: asyncio.AbstractEventLoop) -> None:
        self._probing = True
        self._expected = loop.time() + PROBE_S
        loop.call_at(self._expected, self._tick)

    def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        self.lag = max(0.0, now - self._expected)
        waiting, deltas = self._waiting, self._deltas
        self.behind = self.lag > BEHIND_S and deltas + len(waiting) >= CROWD
        hold = min(MAX_HOLD_S, HOLD_PER_LAG * self.lag) if self.behind else 0.0
        released = 0
        while waiting and released < RELEASE_MAX and now - waiting[0][0] >= hold:
            _, future = waiting.popleft()
            if not future.done():  # a cancelled stream (an abort) left it behind
                future.set_result(None)
                released += 1
        self._idle = 0 if deltas else self._idle + 1
        self._deltas = 0
        if waiting or self._idle < IDLE_PROBES:
            self._expected = now + PROBE_S
            loop.call_at(self._expected, self._tick)
        else:
            self._probing = False
            self.behind = False
            self.lag = 0.0


_turns: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Turns]" = \
    weakref.WeakKeyDictionary()


def turns() -> Turns:
    """The running loop's gate."""
    loop = asyncio.get_running_loop()
    found = _turns.get(loop)
    if found is None:
        found = _turns[loop] = Turns()
    return found
