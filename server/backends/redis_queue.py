"""The run queue of a document in Redis (PROTOCOL.md section 12), shared by every
instance: one list per document, next run first; entries are JSON objects with
at least `run_id`. Lua keeps the length bound and removal by run id atomic."""

from collections.abc import Awaitable
from typing import Any, TypeVar

import orjson
import redis.asyncio as aioredis

T = TypeVar("T")

ENQUEUE_LUA = """
local length = redis.call('LLEN', KEYS[1])
if tonumber(ARGV[2]) > 0 and length >= tonumber(ARGV[2]) then return 0 end
local position = redis.call('RPUSH', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[1], 86400000)
return position
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

    async def _call(self, awaitable: Awaitable[T]) -> T:  # RedisBackend's
        raise NotImplementedError

    async def enqueue_run(self, document_id: str, entry: dict[str, Any], limit: int
                          ) -> int | None:
        script = self._redis.register_script(ENQUEUE_LUA)
        position = await self._call(script(keys=[_key(document_id)],
                                           args=[orjson.dumps(entry).decode(), limit]))
        return int(position) or None

    async def queued_runs(self, document_id: str) -> list[dict[str, Any]]:
        raw: Any = await self._call(self._redis.lrange(_key(document_id), 0, -1))
        return [dict(orjson.loads(item)) for item in raw]

    async def remove_queued(self, document_id: str, run_id: str) -> dict[str, Any] | None:
        script = self._redis.register_script(REMOVE_LUA)
        raw = await self._call(script(keys=[_key(document_id)], args=[run_id]))
        return None if not raw else dict(orjson.loads(raw))
