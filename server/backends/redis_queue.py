"""The run queue of a document in Redis (PROTOCOL.md section 12), shared by every
instance: one list per document, next run first; entries are JSON objects with
at least `run_id`. Lua keeps the length bound and removal by run id atomic.

Every document with a queue is also in `QUEUES_KEY` (a sorted set, scored by when
to look at it next), which the janitors read (`stalled_queues`): a queue whose
document has no active run is started by whichever instance sees it. The instance
where a run ends starts the next one, but not while it shuts down, and not when it
died: the queue then waited for the next `run.start` (for ever if nobody sent one),
and a restarted lone instance never started it."""

from collections.abc import Awaitable
from typing import Any, TypeVar

import orjson
import redis.asyncio as aioredis

from server.backends.redis_clock import RedisClock

T = TypeVar("T")

QUEUES_KEY = "cw:queues"
ENQUEUE_LUA = """
local length = redis.call('LLEN', KEYS[1])
if tonumber(ARGV[2]) > 0 and length >= tonumber(ARGV[2]) then return 0 end
local position = redis.call('RPUSH', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[1], 86400000)
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[4])
return position
"""
# Documents due for a look (score <= ARGV[1]), at most 20: an empty queue leaves the
# set, one behind an active run is looked at again at ARGV[2], one with no active run
# is returned (and looked at again at ARGV[2], in case its start fails).
STALLED_QUEUES_LUA = """
local docs = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, 20)
local out = {}
for _, doc in ipairs(docs) do
  if redis.call('LLEN', 'cw:{' .. doc .. '}:queue') == 0 then
    redis.call('ZREM', KEYS[1], doc)
  else
    redis.call('ZADD', KEYS[1], ARGV[2], doc)
    if redis.call('EXISTS', 'cw:{' .. doc .. '}:active') == 0 then
      table.insert(out, doc)
    end
  end
end
return out
"""
REMOVE_LUA = """
for _, entry in ipairs(redis.call('LRANGE', KEYS[1], 0, -1)) do
  if cjson.decode(entry)['run_id'] == ARGV[1] then
    redis.call('LREM', KEYS[1], 1, entry)
    return entry
  end
end
return false
"""


def _key(document_id: str) -> str:
    return f"cw:{{{document_id}}}:queue"


class RedisRunQueue:
    """Mixed into `RedisBackend`, which provides `_redis` and `_call`."""

    _redis: aioredis.Redis
    _clock: RedisClock

    async def _call(self, awaitable: Awaitable[T]) -> T:  # RedisBackend's
        raise NotImplementedError

    async def enqueue_run(self, document_id: str, entry: dict[str, Any], limit: int
                          ) -> int | None:
        script = self._redis.register_script(ENQUEUE_LUA)
        position = await self._call(script(
            keys=[_key(document_id), QUEUES_KEY],
            args=[orjson.dumps(entry).decode(), limit, self._clock.now_ms(), document_id]))
        return int(position) or None

    async def stalled_queues(self, recheck_s: float) -> list[str]:
        now = self._clock.now_ms()
        script = self._redis.register_script(STALLED_QUEUES_LUA)
        docs: Any = await self._call(script(keys=[QUEUES_KEY],
                                            args=[now, now + int(recheck_s * 1000)]))
        return [str(doc) for doc in docs]

    async def queued_runs(self, document_id: str) -> list[dict[str, Any]]:
        raw: Any = await self._call(self._redis.lrange(_key(document_id), 0, -1))
        return [dict(orjson.loads(item)) for item in raw]

    async def remove_queued(self, document_id: str, run_id: str) -> dict[str, Any] | None:
        script = self._redis.register_script(REMOVE_LUA)
        raw = await self._call(script(keys=[_key(document_id)], args=[run_id]))
        return None if not raw else dict(orjson.loads(raw))
