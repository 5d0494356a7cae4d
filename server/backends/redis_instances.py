"""Which instances are alive (Redis): a sorted set of instance ids scored by when
their heartbeat runs out. A draining instance hands its runs over only when
another one lives (PROTOCOL.md section 13)."""

import time
from collections.abc import Awaitable
from typing import Any, TypeVar

import redis.asyncio as aioredis

T = TypeVar("T")
INSTANCES_KEY = "cw:instances"
LEASES_KEY = "cw:leases"


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class RedisInstances:
    """Mixed into `RedisBackend`, which provides `_redis` and `_call`."""

    _redis: aioredis.Redis

    async def _call(self, awaitable: Awaitable[T]) -> T:  # RedisBackend's
        raise NotImplementedError

    async def heartbeat(self, instance_id: str, ttl_s: float) -> None:
        await self._call(self._redis.zadd(INSTANCES_KEY,
                                          {instance_id: _now_ms() + int(ttl_s * 1000)}))

    async def leave(self, instance_id: str) -> None:
        await self._call(self._redis.zrem(INSTANCES_KEY, instance_id))

    async def live_instances(self) -> list[str]:
        alive: Any = await self._call(self._redis.zrangebyscore(INSTANCES_KEY, _now_ms(), "+inf"))
        return [str(member) for member in alive]  # decode_responses: str members

    async def expire_run_lease(self, document_id: str) -> None:
        """Let another instance's janitor take the run over now (a handoff)."""
        await self._call(self._redis.zadd(LEASES_KEY, {document_id: 0}, xx=True))
