"""Token expiry for every connection of an app, with one loop timer.

An idle connection is most of a server's connections, so what each one holds
while waiting counts. A timer per connection costs a `TimerHandle`, its
context and a bound method (about 740 bytes with the loop's own bookkeeping);
the wheel keeps each connection in a set of the connections that expire in
the same second (a set slot, tens of bytes) and arms one loop timer, for the
earliest of those seconds. A JWT's `exp` is a whole second, so a connection is
closed when its token expires, not later.
"""

import asyncio
import heapq
import math
import time
from collections.abc import Callable

from protocol.codes import CloseCode
from server.connection import Connection

LONGEST_S = 86_400.0  # far-off expiries re-check daily (event loops cap timer delays)


class ExpiryWheel:
    """Close 4001 each watched connection whose token expires before it is
    refreshed (`watch` again after a refresh, `unwatch` when it ends).

    Buckets are whole seconds (`ceil` of the expiry), dropped when their last
    connection leaves; the heap of their seconds may keep stale entries, and
    is rebuilt when those outnumber the live ones (as asyncio does with
    cancelled timers), so churn with long-lived tokens does not grow it. The
    clock (wall time, as `exp` is) is injected; the wheel's only effect is
    `Connection.close`.
    """

    __slots__ = ("_armed_at", "_buckets", "_clock", "_due", "_handle", "_loop")

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._buckets: dict[int, set[Connection]] = {}
        self._due: list[int] = []  # the buckets' seconds, a heap
        self._handle: asyncio.TimerHandle | None = None
        self._armed_at: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def __len__(self) -> int:
        """How many connections are watched."""
        return sum(len(bucket) for bucket in self._buckets.values())

    def watch(self, conn: Connection) -> None:
        """Close `conn` when its current token expires (at once when it has)."""
        self.unwatch(conn)
        expires_at = conn.principal.expires_at
        if expires_at <= self._clock():
            conn.close(CloseCode.UNAUTHENTICATED, "token expired")
            return
        second = math.ceil(expires_at)
        bucket = self._buckets.get(second)
        if bucket is None:
            bucket = self._buckets[second] = set()
            heapq.heappush(self._due, second)
            if len(self._due) > 2 * len(self._buckets) + 64:
                self._due = list(self._buckets)
                heapq.heapify(self._due)
        bucket.add(conn)
        conn.expiry_second = second
        self._arm()

    def unwatch(self, conn: Connection) -> None:
        second = conn.expiry_second
        if second is not None:
            conn.expiry_second = None
            bucket = self._buckets.get(second)
            if bucket is not None:
                bucket.discard(conn)
                if not bucket:
                    del self._buckets[second]

    def _arm(self) -> None:
        """One timer, for the earliest second with a bucket (a new loop, as in
        tests that serve the same app from several loops, gets a new timer)."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._loop, self._handle, self._armed_at = loop, None, None
        due = self._due
        while due and due[0] not in self._buckets:
            heapq.heappop(due)
        if not due:
            return
        first = due[0]
        if self._handle is not None and self._armed_at is not None and self._armed_at <= first:
            return
        if self._handle is not None:
            self._handle.cancel()
        delay = min(max(0.0, first - self._clock()), LONGEST_S)
        self._armed_at = first
        self._handle = loop.call_later(delay, self._fire)

    def _fire(self) -> None:
        self._handle, self._armed_at = None, None
        now = self._clock()
        while self._due and self._due[0] <= now:
            second = heapq.heappop(self._due)
            for conn in self._buckets.pop(second, ()):
                conn.expiry_second = None
                conn.close(CloseCode.UNAUTHENTICATED, "token expired")
        self._arm()
