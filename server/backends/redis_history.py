"""Conversation history in Redis, capped fairly across a document's threads.

The rule is memory_history.py's: at most `HISTORY_MAX_ENTRIES` entries per document
for all its threads together; an append that goes over evicts the oldest entry of the
thread holding the most (ties: the thread whose oldest entry is oldest), one per
excess entry, so a busy thread no longer pushes a quiet one out of
`GET /v1/documents/{id}/threads`. A document with one thread keeps its newest entries.

Keys (all under the document's hash tag):
- `cw:{doc}:hist:t:<thread>` list per thread: `<order>|<entry JSON>`, oldest first,
  `<order>` numbering the document's appends (all threads together);
- `cw:{doc}:hist:threads` sorted set, thread -> `count * SCORE_SPAN - <order of its
  oldest entry>`: its highest member is the thread to evict from (O(log threads));
- `cw:{doc}:hist:meta` hash: `order` (the last order number), `total` (entries kept).
One script per append (instances append concurrently): an append costs O(log threads)
per entry and per evicted entry, never a pass over the history. A read takes every
thread's list in one script and merges them by order.

`cw:{doc}:hist`, the one list (plain JSON, its newest `HISTORY_MAX_ENTRIES`) that
earlier versions read and write, is still written as they wrote it (every append goes
to it too): during a rolling upgrade, or after a rollback, an instance of the previous
release finds the whole history there. Its entries that this layout has not taken in
yet (all of them, for a document written by an earlier version only; those an old
instance appended since) are the ones after the item named by `meta`'s `seen` (the
last item this layout wrote or took in; none: all); an append takes them in, in their
order before its own entries, and a read returns them after the rest, where the next
append puts them. A later release stops writing the old list (and drops it)."""

import heapq
from collections.abc import Awaitable
from operator import itemgetter
from typing import Any, TypeVar

import orjson
import redis.asyncio as aioredis
from redis.commands.core import AsyncScript

from protocol.base import DEFAULT_THREAD
from server.backends.memory_history import thread_key

T = TypeVar("T")

# A thread's score packs its count above its oldest entry's order number: exact in a
# double while count * SCORE_SPAN < 2**53 (a cap below 8,191) and below 2**40 appends.
SCORE_SPAN = 2**40

# The old list's items after `seen` (the last one this layout wrote or took in), in
# order: none when it is the list's last item (the usual case: one LINDEX); all when it
# is not in the list (trimmed away by 2,000 newer old-release appends) or was never set
# (a document only the old release wrote); none when it is lost (the meta hash deleted
# or evicted) while the per-thread lists hold entries: those were taken in already.
_UNSEEN = """
local function unseen(old, seen, threads)
  if not seen or seen == '' then  -- never set; or lost with the meta hash, the lists kept:
    if redis.call('EXISTS', threads) == 1 then return {} end  -- not taken in twice
    return redis.call('LRANGE', old, 0, -1)
  end
  if redis.call('LINDEX', old, -1) == seen then return {} end
  local items = redis.call('LRANGE', old, 0, -1)
  for i = #items, 1, -1 do
    if items[i] == seen then return {unpack(items, i + 1)} end
  end
  return items
end
"""
# KEYS: the old list (also the per-thread lists' prefix), the meta hash, the sorted
# set. ARGV: the cap, the default thread, then a thread and an entry's JSON per entry.
APPEND_HISTORY_LUA = _UNSEEN + f"""
local old, meta, threads = KEYS[1], KEYS[2], KEYS[3]
local cap, span = tonumber(ARGV[1]), {SCORE_SPAN}
local function list_of(thread) return old .. ':t:' .. thread end
local function order_of(item)
  return tonumber(string.sub(item, 1, string.find(item, '|', 1, true) - 1))
end
local total = tonumber(redis.call('HGET', meta, 'total') or '-1')
local order = tonumber(redis.call('HGET', meta, 'order') or '-1')
if total < 0 or order < 0 then  -- a new document, or its meta lost: counted from the lists
  total, order = 0, 0
  for _, thread in ipairs(redis.call('ZRANGE', threads, 0, -1)) do
    total = total + redis.call('LLEN', list_of(thread))
    local newest = redis.call('LINDEX', list_of(thread), -1)
    if newest and order_of(newest) > order then order = order_of(newest) end
  end
end
local function rescore(thread)
  local key = list_of(thread)
  local oldest = redis.call('LINDEX', key, 0)
  if not oldest then
    redis.call('ZREM', threads, thread)
    return
  end
  local score = redis.call('LLEN', key) * span - order_of(oldest)
  redis.call('ZADD', threads, string.format('%.0f', score), thread)
end
local function push(thread, json)
  order = order + 1
  redis.call('RPUSH', list_of(thread), string.format('%.0f', order) .. '|' .. json)
  total = total + 1
  rescore(thread)
  while total > cap do
    local largest = redis.call('ZREVRANGE', threads, 0, 0)[1]
    redis.call('LPOP', list_of(largest))
    total = total - 1
    rescore(largest)
  end
end
for _, json in ipairs(unseen(old, redis.call('HGET', meta, 'seen'), threads)) do
  local thread = ARGV[2]
  local ok, entry = pcall(cjson.decode, json)
  if ok and type(entry) == 'table' then
    local id = entry['thread_id']
    if type(id) == 'string' and id ~= '' then thread = id end
  end
  push(thread, json)
end
local last = nil
for i = 3, #ARGV, 2 do
  push(ARGV[i], ARGV[i + 1])
  redis.call('RPUSH', old, ARGV[i + 1])  -- the previous release's list, as it wrote it
  last = ARGV[i + 1]
end
redis.call('LTRIM', old, -cap, -1)
redis.call('HSET', meta, 'total', string.format('%.0f', total),
           'order', string.format('%.0f', order), 'seen', last)  -- entries: never none
return total
"""
# Every thread's list, then the old list's items not taken in yet (after them, as the
# next append will put them).
READ_HISTORY_LUA = _UNSEEN + """
local out = {}
for _, thread in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do
  out[#out + 1] = redis.call('LRANGE', KEYS[1] .. ':t:' .. thread, 0, -1)
end
out[#out + 1] = unseen(KEYS[1], redis.call('HGET', KEYS[2], 'seen'), KEYS[3])
return out
"""


def _history_keys(document_id: str) -> list[str]:
    old = f"cw:{{{document_id}}}:hist"
    return [old, f"{old}:meta", f"{old}:threads"]


def _numbered(items: list[str]) -> list[tuple[int, str]]:
    numbered = []
    for item in items:
        order, _, body = item.partition("|")
        numbered.append((int(order), body))
    return numbered


class RedisHistory:
    """Mixed into `RedisBackend`, which provides the client and `_call`."""

    _redis: aioredis.Redis
    _history_max_entries: int
    _append_history: AsyncScript
    _read_history: AsyncScript

    async def _call(self, awaitable: Awaitable[T]) -> T:  # RedisBackend's
        raise NotImplementedError

    def _init_history(self, max_entries: int) -> None:
        if not 0 < max_entries < 2**53 // SCORE_SPAN - 1:  # see SCORE_SPAN
            raise ValueError(f"history_max_entries must be 1 to {2**53 // SCORE_SPAN - 2}")
        self._history_max_entries = max_entries
        self._append_history = self._redis.register_script(APPEND_HISTORY_LUA)
        self._read_history = self._redis.register_script(READ_HISTORY_LUA)

    async def append_history(self, document_id: str, entries: list[dict[str, Any]]) -> None:
        if not entries:
            return
        args: list[str | int] = [self._history_max_entries, DEFAULT_THREAD]
        for entry in entries:
            args += [thread_key(entry), orjson.dumps(entry).decode()]
        await self._call(self._append_history(keys=_history_keys(document_id), args=args))

    async def read_history(self, document_id: str) -> list[dict[str, Any]]:
        *threads, unmoved = await self._call(self._read_history(
            keys=_history_keys(document_id)))
        if len(threads) == 1:
            bodies = [body for _, body in _numbered(threads[0])]
        else:
            merged = heapq.merge(*map(_numbered, threads), key=itemgetter(0))
            bodies = [body for _, body in merged]
        return [orjson.loads(body) for body in (*bodies, *unmoved)]
