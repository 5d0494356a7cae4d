"""An adapter's link closed by the engine, as it closes a WebSocket client: the
document log reset (Redis lost it) and the drain of an instance (SIGTERM). A
WebSocket client resumes; the AI SDK and AG-UI streams used to stop mid-run and
never end, a reconnect hung the same way, and the instance kept the chat, the
link and the session for ever (a drain waited its whole timeout for them). Now
the stream ends with an error, the link leaves the document, and the next
request adopts the run again from the log. Real servers on a real redis-server."""

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
import redis.asyncio as aioredis

from server.lifecycle import drain
from tests.adapter_support import sse, user_message
from tests.harness import Server, running_server, token
from tests.redis_support import redis_process
from tests.runs import script

pytestmark = [pytest.mark.redis]
SLOW = script({"say": "x" * 60}, chunk_chars=1, delay_ms=50)
LOST = "connection to the document lost"


def _request(kind: str, server: Server, document_id: str) -> tuple[str, dict[str, Any]]:
    if kind == "ai-sdk":
        return (f"{server.http}/v1/ai-sdk/{document_id}/chat",
                {"id": "chat", "messages": [user_message(SLOW)]})
    return (f"{server.http}/v1/agui/{document_id}",
            {"threadId": "chat", "runId": "agui-1", "state": None, "tools": [], "context": [],
             "forwardedProps": {}, "messages": [{"id": "m", "role": "user", "content": SLOW}]})


async def _items(response: httpx.Response) -> AsyncIterator[Any]:
    async for line in response.aiter_lines():
        if line.startswith("data: "):
            data = line[len("data: "):]
            yield data if data == "[DONE]" else orjson.loads(data)


async def _stream_until(http: httpx.AsyncClient, url: str, body: dict[str, Any],
                        texts: int, then: Any) -> list[Any]:
    """The items of one response; `then()` once `texts` text deltas came. The stream
    must end by itself within 10 s."""
    items: list[Any] = []
    headers = {"Authorization": f"Bearer {token('alice')}"}

    async def read() -> None:
        async with http.stream("POST", url, headers=headers, json=body) as response:
            assert response.status_code == 200
            async for item in _items(response):
                items.append(item)
                if sum(isinstance(i, dict) and i["type"] in ("text-delta",
                       "TEXT_MESSAGE_CONTENT") for i in items) == texts:
                    await then()

    await asyncio.wait_for(read(), 10)
    return items


def _no_link_left(server: Server, document_id: str) -> None:
    assert not server.app.state.chat_runs.runs
    session = server.services.hub.sessions.get(document_id)
    assert session is None or not any(c.session_id.startswith("adapter-")
                                      for c in session.connections.values())


@pytest.mark.parametrize("kind", ["ai-sdk", "agui"])
async def test_a_log_reset_ends_the_stream_and_the_run_is_adopted_again(kind: str) -> None:
    document_id = f"reset-{kind}"
    async with redis_process() as redis, running_server(redis_url=redis.url) as server, \
            httpx.AsyncClient(timeout=15) as http:
        client = aioredis.Redis(port=redis.port)

        async def reset() -> None:  # Redis restarted without persistence, keys flushed
            await client.delete(f"cw:{{{document_id}}}:meta", f"cw:{{{document_id}}}:log")

        url, body = _request(kind, server, document_id)
        try:
            items = await _stream_until(http, url, body, 3, reset)
        finally:
            await client.aclose()
        if kind == "ai-sdk":
            assert [i["type"] for i in items[-5:-2]] == ["text-end", "error", "finish-step"]
            assert items[-4]["errorText"] == f"{LOST} (document log reset); reconnect"
            assert items[-2:] == [{"type": "finish", "finishReason": "error"}, "[DONE]"]
        else:
            assert [i["type"] for i in items[-2:]] == ["TEXT_MESSAGE_END", "RUN_ERROR"]
            assert items[-1]["code"] == "connection_lost"
            assert items[-1]["message"] == f"{LOST} (document log reset); reconnect"
        await asyncio.sleep(0.1)
        _no_link_left(server, document_id)  # nor does it count as the run's executor
        if kind == "ai-sdk":  # a reconnect adopts the run again and follows it to its end
            status, again = await asyncio.wait_for(sse(
                http, "GET", f"{url}/chat/stream"), 10)
            assert status == 200 and again[-2:] == [
                {"type": "finish", "finishReason": "stop"}, "[DONE]"]
        for _ in range(100):
            if await server.services.backend.active_run(document_id) is None:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.1)
        _no_link_left(server, document_id)


async def test_a_drain_detaches_links_at_once_and_the_chat_goes_on_elsewhere() -> None:
    """SIGTERM with another instance alive: the run is handed over, and the draining
    instance closes its connections. Its links used to stay attached until the drain
    gave up (its whole timeout), the frontend's stream stalled and never ended."""
    async with redis_process() as redis, running_server(redis_url=redis.url) as one, \
            running_server(redis_url=redis.url) as two, httpx.AsyncClient(timeout=15) as http:
        url, body = _request("ai-sdk", one, "drained")
        took: list[float] = []

        async def sigterm() -> None:
            started = time.monotonic()
            await drain(one.services, timeout_s=5.0)
            took.append(time.monotonic() - started)

        items = await _stream_until(http, url, body, 3, sigterm)
        assert took and took[0] < 2.0
        error = items[-4]
        assert error["type"] == "error" and error["errorText"] == (
            f"{LOST} (server shutting down; resume on another instance); reconnect")
        assert items[-2:] == [{"type": "finish", "finishReason": "error"}, "[DONE]"]
        _no_link_left(one, "drained")
        # The frontend reconnects (through the other instance): the run went on there.
        status, again = await asyncio.wait_for(sse(
            http, "GET", f"{two.http}/v1/ai-sdk/drained/chat/chat/stream"), 10)
        assert status == 200 and again[-2:] == [{"type": "finish", "finishReason": "stop"},
                                                "[DONE]"]
        assert again[0] == items[0]  # the same assistant message
