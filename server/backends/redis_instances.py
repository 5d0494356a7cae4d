"""Which instances are alive, and their inboxes (Redis).

Instances: a sorted set of instance ids scored by when their heartbeat runs out. A
draining instance hands its runs over only when another one lives (PROTOCOL.md
section 13).

Inboxes: one stream per instance. A message about a run is sent to the inbox of
the run's lease holder as read atomically with the send (`send_to_run_owner`), and every
message but a reply is claimed (deleted) by whoever acts on it: the instance
itself, or the next owner of a run its dead or draining owner left messages for.
So a takeover loses no message, and no message is acted on twice.
"""

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

import orjson
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from server.backends.base import cancel_requested
from server.backends.redis_clock import RedisClock
from server.backends.redis_scripts import SEND_TO_OWNER_LUA

T = TypeVar("T")
INSTANCES_KEY = "cw:instances"
INBOX_MAXLEN = 10_000
INBOX_TTL_S = 3600
DEAD_INSTANCE_KEPT_MS = 3_600_000
logger = logging.getLogger("cowrite.redis")


def _inbox_key(instance_id: str) -> str:
    return f"cw:inbox:{instance_id}"


class RedisInstances:
    """Mixed into `RedisBackend`, which provides `_redis`, `_url` and `_call`."""

    _redis: aioredis.Redis
    _url: str
    _clock: RedisClock
    _instance_id: str
    _heartbeat_ttl_s = 0.0  # the last heartbeat's (RedisBackend renews it after an outage)

    async def _call(self, awaitable: Awaitable[T]) -> T:  # RedisBackend's
        raise NotImplementedError

    async def heartbeat(self, instance_id: str, ttl_s: float) -> None:
        """Say this instance lives for `ttl_s` more; forget instances an hour dead (a
        killed instance never leaves: the set grew by one per crash, for ever)."""
        self._instance_id = instance_id  # named in its connections' presence entries
        self._heartbeat_ttl_s = ttl_s
        with contextlib.suppress(RedisError, OSError):  # the clock of the next stamps
            await self._clock.sync(self._redis)
        now = self._clock.now_ms()
        pipe = self._redis.pipeline(transaction=False)
        pipe.zadd(INSTANCES_KEY, {instance_id: now + int(ttl_s * 1000)})
        pipe.zremrangebyscore(INSTANCES_KEY, "-inf", now - DEAD_INSTANCE_KEPT_MS)
        await self._call(pipe.execute())

    async def leave(self, instance_id: str) -> None:
        self._heartbeat_ttl_s = 0.0
        await self._call(self._redis.zrem(INSTANCES_KEY, instance_id))

    async def live_instances(self) -> list[str]:
        alive: Any = await self._call(self._redis.zrangebyscore(INSTANCES_KEY,
                                                                self._clock.now_ms(), "+inf"))
        return [str(member) for member in alive]  # decode_responses: str members

    # -- inboxes -------------------------------------------------------------------
    async def send(self, instance_id: str, message: dict[str, Any]) -> None:
        key = _inbox_key(instance_id)
        pipe = self._redis.pipeline(transaction=False)
        pipe.xadd(key, {"m": orjson.dumps(message).decode()}, maxlen=INBOX_MAXLEN,
                  approximate=True)
        pipe.expire(key, INBOX_TTL_S)
        await self._call(pipe.execute())

    async def send_to_run_owner(self, document_id: str, run_id: str, message: dict[str, Any],
                                not_to: str = "", park: bool = False) -> str | None:
        owner = await self._call(self._redis.eval(
            SEND_TO_OWNER_LUA, 2, f"cw:{{{document_id}}}:active", f"cw:{{{document_id}}}:owner",
            run_id, orjson.dumps(message).decode(), INBOX_MAXLEN, INBOX_TTL_S, not_to,
            "1" if park else "0"))
        return None if owner is None else str(owner)

    async def inbox(self, instance_id: str) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """Messages for this instance, in order; survives Redis reconnects."""
        key, last_id = _inbox_key(instance_id), "0-0"
        reader = aioredis.Redis.from_url(self._url, decode_responses=True,
                                         socket_connect_timeout=2.0)
        delay = 0.0  # > 0 while failing: the next wait (0.1 s doubling to 2 s)
        try:
            while not cancel_requested():
                try:
                    batches: Any = await reader.xread({key: last_id}, block=1000, count=100)
                except (RedisError, OSError) as exc:  # said once per outage, not per attempt
                    logger.log(logging.DEBUG if delay else logging.WARNING,
                               "inbox read failed (%s); retrying", exc)
                    delay = min(delay * 2, 2.0) if delay else 0.1
                    await asyncio.sleep(delay)
                    continue
                if delay:
                    logger.info("inbox reads work again")
                    delay = 0.0
                for _stream, entries in batches or ():
                    for entry_id, fields in entries:
                        last_id = entry_id
                        yield entry_id, dict(orjson.loads(fields["m"]))
        finally:
            await reader.aclose()

    async def has_message(self, instance_id: str, entry_id: str) -> bool:
        found: Any = await self._call(self._redis.xrange(_inbox_key(instance_id), entry_id,
                                                         entry_id, count=1))
        return bool(found)

    async def take_message(self, instance_id: str, entry_id: str) -> bool:
        return bool(await self._call(self._redis.xdel(_inbox_key(instance_id), entry_id)))

    async def unread_messages(self, instance_id: str) -> list[tuple[str, dict[str, Any]]]:
        entries: Any = await self._call(self._redis.xrange(_inbox_key(instance_id)))
        return [(entry_id, dict(orjson.loads(fields["m"]))) for entry_id, fields in entries]
