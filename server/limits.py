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
        self._burst = burst
        self._tokens = burst
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
    """Sockets accepted but not yet past `hello`, per instance (section 1).

    A peer that opens sockets and never says hello holds each one for the
    hello timeout; beyond `limit` of them new upgrades are refused (HTTP 503)
    before accept, so such a flood costs no WebSocket state. 0 disables it.
    """

    __slots__ = ("limit", "pending", "refused")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.pending = 0
        self.refused = 0

    def enter(self) -> bool:
        """Count one more pending handshake; False (nothing counted) when full."""
        if self.limit and self.pending >= self.limit:
            self.refused += 1
            return False
        self.pending += 1
        return True

    def leave(self) -> None:
        self.pending -= 1
