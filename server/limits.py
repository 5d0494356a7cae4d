"""Per-connection limits (PROTOCOL.md sections 6a and 7), free of I/O.

The clock is injected so the decisions can be tested without sleeping.
"""

import time
from collections.abc import Callable


class TokenBucket:
    """`rate` tokens per second, holding at most `burst`; rate 0 disables it."""

    __slots__ = ("_burst", "_clock", "_rate", "_stamp", "_tokens")

    def __init__(
        self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._rate = rate
        self._burst = max(1.0, burst)  # under one (a rate below 0.5/s) no token ever came
        self._tokens = self._burst
        self._clock = clock
        self._stamp = clock()

    def take(self) -> int:
        """0 when a token was taken, else the milliseconds until one will be there."""
        if self._rate <= 0:
            return 0
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._stamp) * self._rate)
        self._stamp = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return 0
        return max(1, int((1.0 - self._tokens) / self._rate * 1000) + 1)


class UserBuckets:
    """A `TokenBucket` per user, for requests that have no connection to hold one (the
    HTTP tool results). At most `kept` users are remembered; beyond that the one
    heard from longest ago is forgotten (it starts again with a full bucket)."""

    __slots__ = ("_buckets", "_burst", "_clock", "_kept", "_rate")

    def __init__(self, rate: float, burst: float, kept: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._rate, self._burst, self._kept, self._clock = rate, burst, kept, clock
        self._buckets: dict[str, TokenBucket] = {}

    def take(self, user_id: str) -> int:
        """As `TokenBucket.take`, from `user_id`'s bucket."""
        bucket = self._buckets.pop(user_id, None)  # re-inserted: the newest at the end
        if bucket is None:
            bucket = TokenBucket(self._rate, self._burst, self._clock)
            if len(self._buckets) >= self._kept:
                del self._buckets[next(iter(self._buckets))]
        self._buckets[user_id] = bucket
        return bucket.take()


class InvalidStreak:
    """Counts invalid frames in a row; the `limit`-th one means close 4400."""

    __slots__ = ("count", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.count = 0

    def record_invalid(self) -> bool:
        """Count one; True when the connection must now be closed."""
        self.count += 1
        return self.limit > 0 and self.count >= self.limit

    def record_valid(self) -> None:
        self.count = 0


class HandshakeGate:
    """Sockets accepted but not yet past `hello` (or, on the AI SDK socket, a request
    with a good token), per instance (section 1).

    A peer that opens sockets and never says hello holds each one for the hello
    timeout. Beyond `limit` of them the oldest pending socket is closed to make room
    (`evict`): they used to refuse every new upgrade (503), so ~50 tokenless sockets a
    second kept every user out, while now a real client, whose hello follows its
    upgrade within milliseconds, is through before a flood reaches it. 0 disables it.
    """

    __slots__ = ("_next", "_waiting", "evicted", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.evicted = 0
        self._waiting: dict[int, Callable[[], None]] = {}  # oldest first
        self._next = 0

    @property
    def pending(self) -> int:
        return len(self._waiting)

    def enter(self, evict: Callable[[], None]) -> int:
        """Count one more pending handshake, closing the oldest (`evict`) when full; the
        ticket to `leave` with."""
        if not self.limit:
            return -1
        if len(self._waiting) >= self.limit:
            oldest = next(iter(self._waiting))
            self._waiting.pop(oldest)()
            self.evicted += 1
        self._next += 1
        self._waiting[self._next] = evict
        return self._next

    def leave(self, ticket: int) -> None:
        self._waiting.pop(ticket, None)
