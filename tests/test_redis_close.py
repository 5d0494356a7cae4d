"""A Redis backend that was closed opens no connection again.

A document's last listener leaving unsubscribes its channel in a task of its own. When
it left after the backend closed (an adapter's run closing its link as the instance
stopped), that task sent UNSUBSCRIBE through the closed pub/sub, which reconnected:
a connection nobody closed, found by the collector later (tests/leaks.py caught it in
tests/test_adapter_answer_lag.py, one run in five on a loaded host)."""

import asyncio
import contextlib

import pytest
import redis.asyncio as aioredis

from server.backends.base import LoggedEvent
from server.backends.redis import RedisBackend
from tests.redis_support import redis_process

pytestmark = [pytest.mark.redis]


async def _others_done() -> None:
    """Every task of the loop but this one has ended (the unsubscribe among them)."""
    this = asyncio.current_task()
    await asyncio.wait_for(asyncio.gather(
        *(task for task in asyncio.all_tasks() if task is not this),
        return_exceptions=True), 10)


async def test_a_listener_leaving_after_close_opens_no_connection() -> None:
    heard = asyncio.Event()

    def listener(event: LoggedEvent) -> None:
        heard.set()

    async with redis_process() as redis:
        backend, other = RedisBackend(redis.url), RedisBackend(redis.url)
        await backend.start()
        await backend.subscribe("doc", listener)
        try:  # another instance's event arrives: the pub/sub listens to the document
            for _ in range(40):
                await other.append("doc", {"type": "document.changed"})
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(heard.wait(), 0.5)
                    break
        finally:
            await other.close()
        assert heard.is_set()
        await backend.close()
        backend.unsubscribe("doc", listener)  # its link closed as the instance stopped
        await _others_done()
        async with aioredis.Redis(port=redis.port, decode_responses=True) as admin:
            await admin.client_setname("admin")
            clients = await admin.client_list()
        assert [c["name"] for c in clients] == ["admin"], clients
