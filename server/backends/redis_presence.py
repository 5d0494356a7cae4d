"""Shared limits and presence in Redis, kept up by each instance for its own connections.

Connections per user: a sorted set per user whose entries (scored by when they
expire) their instance renews; run starts: a sliding-window sorted set. Presence (who
executes a document's client tools): a sorted set per document, each entry naming
its instance, so a killed instance's tabs stop counting when its heartbeat lapses.

An outage can outlast those scores: once Redis answers again each instance renews its
entries and its heartbeat at once (`_renew_loop`, with plain ZADDs that add back an
entry that lapsed), and for `OUTAGE_GRACE_S` meanwhile nobody is judged gone.
"""

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable
from typing import TypeVar

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript
from redis.exceptions import RedisError

from server.backends.base import cancel_requested
from server.backends.redis_clock import RedisClock
from server.backends.redis_instances import INSTANCES_KEY

T = TypeVar("T")
CONNECTION_TTL_S = 90.0
RENEW_EVERY_S = 30.0
RENEW_RETRY_S = 1.0
OUTAGE_GRACE_S = 10.0  # see `is_present`


class RedisPresence:
    """Mixed into `RedisBackend`, which provides the client, the scripts and `_call`
    (which keeps `_failing` and `_back_at`, and sets `_renew_now` when Redis is back)."""

    _redis: aioredis.Redis
    _clock: RedisClock
    _connection: AsyncScript
    _run_slot: AsyncScript
    _present: AsyncScript
    _instance_id: str
    _heartbeat_ttl_s: float
    _live_connections: dict[str, str]  # connection id -> user id
    _presence: dict[str, tuple[str, str]]  # member -> (document id, as stored)
    _failing: bool  # the last call failed: Redis is out of reach
    _back_at: float  # when a call worked again after failing (monotonic)
    _renew_now: asyncio.Event

    async def _call(self, awaitable: Awaitable[T]) -> T:  # RedisBackend's
        raise NotImplementedError

    async def acquire_connection(self, user_id: str, connection_id: str, limit: int) -> bool:
        now = self._clock.now_ms()
        granted = await self._call(self._connection(
            keys=[f"cw:conns:{{{user_id}}}"],
            args=[now, now + int(CONNECTION_TTL_S * 1000), limit, connection_id]))
        if granted:
            self._live_connections[connection_id] = user_id
        return bool(granted)

    async def release_connection(self, user_id: str, connection_id: str) -> None:
        self._live_connections.pop(connection_id, None)
        await self._call(self._redis.zrem(f"cw:conns:{{{user_id}}}", connection_id))

    async def _renew_loop(self) -> None:
        """Keep this instance's connection slots and presence entries alive (a dead
        instance's expire): every `RENEW_EVERY_S`, every `RENEW_RETRY_S` while Redis
        fails, and at once when it answers again, with the heartbeat then (an outage
        may have outlasted the scores: until renewed, its tabs counted as gone)."""
        while not cancel_requested():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._renew_now.wait(),
                                       RENEW_RETRY_S if self._failing else RENEW_EVERY_S)
            back = self._renew_now.is_set() or self._failing  # Redis is back, or may be
            self._renew_now.clear()
            try:
                if not await self._renew(heartbeat=back):
                    continue  # nothing to renew: nothing learnt of Redis either
            except (RedisError, OSError):
                self._failing = True
                continue
            if self._failing:  # back, and no call saw it first
                self._failing, self._back_at = False, time.monotonic()

    async def _renew(self, heartbeat: bool) -> bool:
        expires = self._clock.now_ms() + int(CONNECTION_TTL_S * 1000)
        slots, present = list(self._live_connections.items()), list(self._presence.items())
        pipe = self._redis.pipeline(transaction=False)
        for connection_id, user_id in slots:  # not ZADD XX: added again if it lapsed
            key = f"cw:conns:{{{user_id}}}"
            pipe.zadd(key, {connection_id: expires})
            # the key's own expiry too: it lapsed 90 s after the last new
            # connection, and the user's count began again from zero
            pipe.pexpire(key, int(CONNECTION_TTL_S * 1000))
        for _member, (document_id, stored) in present:
            pipe.zadd(f"cw:{{{document_id}}}:present", {stored: expires})
        if heartbeat and self._heartbeat_ttl_s:
            pipe.zadd(INSTANCES_KEY, {self._instance_id: self._clock.now_ms()
                                      + int(self._heartbeat_ttl_s * 1000)})
        if not len(pipe):
            return False
        await pipe.execute()
        # One released meanwhile was perhaps added back: removed again (after the ZADD).
        gone = [(f"cw:conns:{{{user_id}}}", connection_id) for connection_id, user_id in slots
                if connection_id not in self._live_connections]
        gone += [(f"cw:{{{document_id}}}:present", stored) for member, (document_id, stored)
                 in present if self._presence.get(member) != (document_id, stored)]
        if gone:
            pipe = self._redis.pipeline(transaction=False)
            for key, member in gone:
                pipe.zrem(key, member)
            await pipe.execute()
        return True

    async def take_run_slot(self, user_id: str, per_minute: int) -> int:
        if not per_minute:
            return 0
        wait = await self._call(self._run_slot(
            keys=[f"cw:runs-per-min:{{{user_id}}}"],
            args=[self._clock.now_ms(), per_minute, uuid.uuid4().hex]))
        return max(0, int(float(wait)))

    async def set_presence(self, document_id: str, member: str, present: bool) -> None:
        key = f"cw:{{{document_id}}}:present"
        if present:  # stored with the instance's id: a dead instance's tabs are gone
            stored = f"{member}|{self._instance_id}"
            self._presence[member] = (document_id, stored)
            expires = self._clock.now_ms() + int(CONNECTION_TTL_S * 1000)
            await self._call(self._redis.zadd(key, {stored: expires}))
        else:
            entry = self._presence.pop(member, None)
            if entry is not None:
                await self._call(self._redis.zrem(key, entry[1]))

    async def is_present(self, document_id: str, user_id: str, client_id: str) -> bool:
        """Whether a connection of the client lives on some instance. Right after an
        outage (`OUTAGE_GRACE_S`) the answer is yes: the instances' presence entries and
        heartbeats may have lapsed meanwhile, and each renews them as it reaches Redis
        again (`_renew_loop`); a run waiting on a tab that stayed connected to another
        instance ended `client_gone` a second after Redis came back."""
        found = await self._call(self._present(
            keys=[f"cw:{{{document_id}}}:present", INSTANCES_KEY],
            args=[self._clock.now_ms(), f"{user_id}|{client_id}|"]))
        return bool(found) or time.monotonic() - self._back_at < OUTAGE_GRACE_S
