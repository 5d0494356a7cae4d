"""Redis's clock, as every instance reads it.

Leases, heartbeats, connection slots and presence are scores in sorted sets that
one instance writes and another compares with "now". Stamped with each
instance's own wall clock, an instance whose clock ran a lease ahead saw
another's healthy runs as lapsed and took them over (and one running behind
kept its dead slots alive longer). So every instance stamps with Redis's clock
instead: it measures how far that is from its own (`TIME`, allowing half the
round trip) at start and with every heartbeat, and adds the difference.
"""

import time

import redis.asyncio as aioredis


class RedisClock:
    def __init__(self) -> None:
        self.offset_ms = 0.0  # Redis's clock minus this host's; 0 until first measured

    def now_ms(self) -> int:
        return int(time.time_ns() / 1_000_000 + self.offset_ms)

    async def sync(self, redis: aioredis.Redis) -> None:
        """Measure the offset again (raises what the Redis call raises)."""
        before = time.time_ns()
        seconds, micros = await redis.time()
        after = time.time_ns()
        self.offset_ms = seconds * 1000 + micros / 1000 - (before + after) / 2_000_000
