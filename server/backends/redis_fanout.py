"""Live fan-out of a document's events between instances (Redis pub/sub).

One Lua script (redis_scripts.APPEND_LUA) stamps an event's seq and publishes its
frame on `cw:live:{doc}` as `epoch seq type frame`, so pub/sub delivers in seq
order and every instance sees when the log restarted under another epoch (its
keys deleted or evicted while Redis stayed up), not only the one that appended. Pub/sub drops what
is published while a subscriber is away, so each instance notes how far it has
seen every document it listens to and, once reconnected, reads what it missed
from the log; a log that came back under another epoch (Redis lost its data) is
announced to the subscribers' `on_reset` instead.
"""

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from server.backends.base import (
    BackendUnavailable,
    EventListener,
    LoggedEvent,
    LogHead,
    LogReset,
    ResumeFailure,
    cancel_requested,
)

logger = logging.getLogger("cowrite.redis")
PUBSUB_QUIET_S = 5.0  # see `RedisFanOut._messages`


def channel_of(document_id: str) -> str:
    return f"cw:live:{{{document_id}}}"


def _parse_live(data: str) -> tuple[str | None, LoggedEvent] | None:
    """`epoch seq type frame` (or `seq type frame`, as instances of the previous release
    publish during a rolling upgrade: epoch None), or None when it is neither: one bad
    frame used to end the pub/sub loop for good, and the instance heard nothing more."""
    try:
        first, second, rest = data.split(" ", 2)
        if not second.isdigit():  # `seq type frame`: a type is never a number
            return None, LoggedEvent(int(first), second, rest)
        event_type, frame = rest.split(" ", 1)
        return first, LoggedEvent(int(second), event_type, frame)
    except ValueError:
        return None


class RedisFanOut:
    """Mixed into `RedisBackend`, which provides `_redis`, `head` and `read_after`."""

    _redis: aioredis.Redis
    _listeners: dict[str, list[EventListener]]
    _on_reset: dict[str, dict[EventListener, LogReset]]  # document id -> listener's reset
    _last_seen: dict[str, tuple[str, int]]  # document id -> (epoch, last seq seen)
    _subscribe_lock: asyncio.Lock
    _pubsub: Any
    reconnects: int

    async def head(self, document_id: str) -> LogHead:  # RedisBackend's
        raise NotImplementedError

    async def read_after(self, document_id: str, epoch: str, after_seq: int,
                         until_seq: int | None = None) -> list[LoggedEvent] | ResumeFailure:
        raise NotImplementedError

    async def subscribe(self, document_id: str, listener: EventListener,
                        on_reset: LogReset | None = None) -> None:
        first = not self._listeners.get(document_id)
        self._listeners[document_id].append(listener)
        if on_reset is not None:
            self._on_reset.setdefault(document_id, {})[listener] = on_reset
        if first:
            async with self._subscribe_lock:
                if self._pubsub is not None:
                    with contextlib.suppress(RedisError, OSError):
                        await self._pubsub.subscribe(channel_of(document_id))
            # Where the log stood: a reconnected subscriber reads on from here, even for a
            # document that only ever sees other instances' events.
            with contextlib.suppress(BackendUnavailable):
                head = await self.head(document_id)
                if document_id in self._listeners and document_id not in self._last_seen:
                    self._last_seen[document_id] = (head.epoch, head.last_seq)

    def unsubscribe(self, document_id: str, listener: EventListener) -> None:
        resets = self._on_reset.get(document_id)
        if resets is not None and resets.pop(listener, None) is not None and not resets:
            del self._on_reset[document_id]
        listeners = self._listeners.get(document_id)
        if listeners and listener in listeners:
            listeners.remove(listener)
        if listeners is not None and not listeners:
            del self._listeners[document_id]
            self._last_seen.pop(document_id, None)
            if self._pubsub is not None:
                task = asyncio.get_running_loop().create_task(self._unsubscribe(document_id))
                task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def _unsubscribe(self, document_id: str) -> None:
        async with self._subscribe_lock:
            if document_id not in self._listeners and self._pubsub is not None:
                with contextlib.suppress(RedisError, OSError):
                    await self._pubsub.unsubscribe(channel_of(document_id))

    def _deliver(self, document_id: str, epoch: str | None, event: LoggedEvent) -> None:
        """Hand `event` to the document's listeners, noting how far this instance has
        seen the log; an event of another epoch than the last seen resets them first.
        `epoch` is None for a frame of an instance of the previous release (no epoch)."""
        seen = self._last_seen.get(document_id)
        if seen is None:
            if epoch is not None:
                self._last_seen[document_id] = (epoch, event.seq)
        elif epoch is not None and epoch != seen[0]:
            self._reset(document_id, epoch, event.seq)
        elif event.seq > seen[1]:
            self._last_seen[document_id] = (seen[0], event.seq)
        for listener in tuple(self._listeners.get(document_id, ())):
            listener(event)

    def _reset(self, document_id: str, epoch: str, last_seq: int) -> None:
        """The log restarted under `epoch`: each subscriber's `on_reset` is called (their
        connections must resume, and be told `epoch_changed`), then the listeners go on
        from the new log."""
        logger.warning("the log of document %s was reset (Redis lost its data)", document_id,
                       extra={"document_id": document_id})
        self._last_seen[document_id] = (epoch, last_seq)
        for on_reset in tuple(self._on_reset.get(document_id, {}).values()):
            on_reset(epoch)

    async def _pubsub_loop(self) -> None:
        """Receive live frames; after any reconnect, re-read what was missed."""
        delay, down = 0.1, False
        while not cancel_requested():
            try:
                async with self._subscribe_lock:
                    # Every frame is heard (`_messages`): ignoring subscribe messages also
                    # dropped PONGs, which redis-py parses oddly with decode_responses.
                    self._pubsub = self._redis.pubsub(ignore_subscribe_messages=False)
                    await self._pubsub.subscribe("cw:instance-alive")
                    channels = [channel_of(doc) for doc in self._listeners]
                    if channels:
                        await self._pubsub.subscribe(*channels)
                if self.reconnects:
                    # Redis is back: the pool's idle connections are to the old server and
                    # each would fail one real command ("Connection closed by server").
                    await self._redis.connection_pool.disconnect(inuse_connections=False)
                await self._catch_up()
                if down:
                    logger.info("redis pub/sub is back")
                delay, down = 0.1, False
                async for message in self._messages():
                    channel: str = message["channel"]
                    if not channel.startswith("cw:live:{"):
                        continue
                    document_id = channel[len("cw:live:{"):-1]
                    live = _parse_live(message["data"])
                    if live is None:
                        logger.warning("skipped a malformed live frame on %s", channel[:200])
                        continue
                    try:
                        self._deliver(document_id, *live)
                    except Exception:  # one frame's failure must not end the fan-out
                        logger.exception("delivering a live frame of %s failed", document_id)
            except asyncio.CancelledError:
                raise
            except (RedisError, OSError, BackendUnavailable) as exc:  # once per outage
                # BackendUnavailable: catching up (head, read_after) failed, e.g. Redis
                # still loading after a restart; the loop ended there for good.
                logger.log(logging.DEBUG if down else logging.WARNING,
                           "redis pub/sub lost (%s); reconnecting", exc)
                down = True
            self.reconnects += 1
            await self._retire_pubsub()
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    async def _retire_pubsub(self) -> None:
        """Close the pub/sub for good, under the lock its (un)subscribers take: a
        document's last listener leaving unsubscribes in a task of its own, and that
        task's UNSUBSCRIBE through a closed pub/sub reconnected it, a connection nobody
        closed (after `close`: seen in the tests' leak check)."""
        async with self._subscribe_lock:
            pubsub, self._pubsub = self._pubsub, None
            if pubsub is not None:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()

    async def _messages(self) -> AsyncIterator[dict[str, Any]]:
        """Published frames, until the connection fails. A connection that only goes
        quiet (its peer vanished without a reset: a failover, a dead host) is asked
        for a PONG after `PUBSUB_QUIET_S` and given up as lost if none comes within as
        long again; without this the instance heard nothing more until it restarted."""
        clock = asyncio.get_running_loop().time
        heard, pinged = clock(), False
        while not cancel_requested():
            message = await self._pubsub.get_message(timeout=1.0)
            now = clock()
            if message is not None:
                heard, pinged = now, False
                if message.get("type") == "message":
                    yield message
            elif now - heard > PUBSUB_QUIET_S * (2 if pinged else 1):
                if pinged:
                    raise RedisConnectionError("pub/sub connection silent; no PONG")
                pinged = True
                await self._pubsub.ping()

    async def _catch_up(self) -> None:
        """Deliver events appended while this instance was not listening, or tell the
        listeners the log is not the one they knew (Redis came back without it)."""
        for document_id, (epoch, last) in list(self._last_seen.items()):
            missed = await self.read_after(document_id, epoch, last)
            if isinstance(missed, list):
                for event in missed:
                    self._deliver(document_id, epoch, event)
            elif missed == "epoch_changed" and document_id in self._listeners:
                head = await self.head(document_id)
                self._reset(document_id, head.epoch, head.last_seq)
