"""What the Redis backend keeps up over time: the per-user connection count past its
key's expiry, bounded keys, and a pub/sub connection that goes silent. A real
redis-server; the backend in this process so its clocks can be made short."""

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import pytest
import redis.asyncio as aioredis

from server.backends import redis_fanout, redis_presence
from server.backends.base import RUN_RECORDS_MAX, LoggedEvent
from server.backends.redis import RedisBackend
from tests.harness import free_port
from tests.redis_support import redis_process

pytestmark = pytest.mark.redis


@contextlib.asynccontextmanager
async def started(url: str) -> AsyncIterator[RedisBackend]:
    backend = RedisBackend(url)
    await backend.start()
    try:
        yield backend
    finally:
        await backend.close()


async def test_the_connection_limit_still_counts_after_the_keys_first_expiry(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(redis_presence, "CONNECTION_TTL_S", 1.0)
    monkeypatch.setattr(redis_presence, "RENEW_EVERY_S", 0.3)
    async with redis_process() as proc, started(proc.url) as backend:
        assert await backend.acquire_connection("carol", "c1", limit=2)
        assert await backend.acquire_connection("carol", "c2", limit=2)
        await asyncio.sleep(2.5)  # 2.5 TTLs: the key used to lapse with both still open
        assert not await backend.acquire_connection("carol", "c3", limit=2)
        await backend.release_connection("carol", "c1")
        assert await backend.acquire_connection("carol", "c3", limit=2)


async def test_dead_instances_and_old_run_records_do_not_pile_up() -> None:
    async with redis_process() as proc, started(proc.url) as backend, \
            aioredis.Redis(port=proc.port, decode_responses=True) as admin:
        await admin.zadd("cw:instances", {"killed-long-ago": 1, "killed-just-now": 10**15})
        await backend.heartbeat("me", 10)
        assert set(await admin.zrange("cw:instances", 0, -1)) == {"me", "killed-just-now"}

        for n in range(RUN_RECORDS_MAX + 5):
            await backend.put_run_record("busy", f"run-{n}", {"status": "completed"})
        await backend.put_run_record("busy", "run-3", {"status": "rewritten"})  # no reorder
        assert await admin.hlen("cw:{busy}:runs") == RUN_RECORDS_MAX
        assert await backend.get_run_record("busy", "run-5") is None
        assert await backend.get_run_record("busy", "run-6") == {"status": "completed"}
        assert await backend.get_run_record("busy", f"run-{RUN_RECORDS_MAX + 4}") is not None


class FreezingProxy:
    """A TCP proxy to Redis that can stop forwarding on the connections it has without
    closing them: a peer that vanished with no reset (a failover, a dead host)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self._frozen: list[asyncio.Event] = []
        self._pumps: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> "FreezingProxy":
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in self._pumps:
            task.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)
        for writer in self._writers:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        await self._server.wait_closed()

    def freeze(self) -> None:
        for event in self._frozen:
            event.set()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        frozen = asyncio.Event()
        self._frozen.append(frozen)
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        self._writers += [writer, up_writer]

        async def pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await source.read(65536):
                    if frozen.is_set():
                        await asyncio.Future()  # hold the bytes, close nothing
                    sink.write(data)
                    await sink.drain()

        for source, sink in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(pump(source, sink))
            self._pumps.add(task)


async def test_a_silent_pubsub_connection_is_given_up_and_what_it_missed_arrives(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(redis_fanout, "PUBSUB_QUIET_S", 0.5)
    async with redis_process() as proc, FreezingProxy(proc.port) as proxy, \
            started(f"redis://127.0.0.1:{proxy.port}/0") as listening, \
            started(proc.url) as writing:
        seen: list[LoggedEvent] = []
        await listening.subscribe("doc", seen.append)
        await writing.append("doc", {"type": "document.changed", "document_version": 1})
        await _until(lambda: len(seen) == 1)
        proxy.freeze()  # every connection so far: pub/sub and the pool's
        await writing.append("doc", {"type": "document.changed", "document_version": 2})
        # It used to wait on the frozen connection until the process restarted.
        await _until(lambda: [e.seq for e in seen] == [1, 2], timeout=15)


async def _until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():  # noqa: ASYNC110 - the listener is a plain callback
            await asyncio.sleep(0.05)



async def test_a_quiet_healthy_pubsub_connection_is_kept(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """Asked for a PONG when quiet, a healthy connection answers and stays: the PONG was
    dropped (redis-py reads it as a subscribe message), so every idle instance
    reconnected every 10 s with a warning and emptied its connection pool."""
    monkeypatch.setattr(redis_fanout, "PUBSUB_QUIET_S", 0.3)
    async with redis_process() as proc, started(proc.url) as backend:
        seen: list[LoggedEvent] = []
        await backend.subscribe("doc", seen.append)
        await asyncio.sleep(2.0)  # six quiet periods
        assert backend.reconnects == 0
        await backend.append("doc", {"type": "document.changed", "document_version": 1})
        await _until(lambda: [e.seq for e in seen] == [1])


async def test_a_catch_up_that_fails_does_not_end_the_subscriber() -> None:
    """Pub/sub back, but Redis cannot run scripts yet (loading after a restart; here
    paused): catching up failed with BackendUnavailable, which ended the subscriber for
    good; it retries, and later events arrive."""
    async with redis_process() as proc, started(proc.url) as listening, \
            started(proc.url) as writing, \
            aioredis.Redis(port=proc.port) as admin:
        seen: list[LoggedEvent] = []
        await listening.subscribe("doc", seen.append)
        await writing.append("doc", {"type": "document.changed", "document_version": 1})
        await _until(lambda: [e.seq for e in seen] == [1])
        await admin.execute_command(  # type: ignore[no-untyped-call]
            "CLIENT", "PAUSE", "3000", "WRITE")
        await admin.client_kill_filter(_type="pubsub")
        await asyncio.sleep(3.5)
        await writing.append("doc", {"type": "document.changed", "document_version": 2})
        await _until(lambda: [e.seq for e in seen] == [1, 2], timeout=10)
