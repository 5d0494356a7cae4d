"""Answers lost between the run and the frontend, through the adapters of real servers.

A frontend's answer (a tool result, an approval) can be applied by the run while
the request carrying it is answered `503 unavailable`: the instance it reached
drained (or its document log was reset) before the run's ack came back. The
frontend retries, and got `409 call_not_pending` (the run had applied it), then
a reconnect got 204 once the run ended: the rest of the answer never reached
the UI. A stream that broke off before the run ended lost its rest the same
way. Now a retried answer the run applied, whose segment no request streamed
to its end, streams that segment again (once), and a reconnect after the run
ended replays it when its end never reached the frontend (once).

The drain lands between the apply and the ack: the run's owner is the second
instance, whose Redis replies are held (`DelayReplyProxy`) after it logged the
answer's `tool.done`, while the answer went through the first one.
"""

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import orjson
import pytest
import redis.asyncio as aioredis

from server.lifecycle import drain
from tests.adapter_support import sse, user_message
from tests.harness import Client, Server, joined, running_server, token, ws_client
from tests.kill_proxy import DelayReplyProxy
from tests.redis_support import redis_process
from tests.runs import READ, call, script, start

AUTH = {"Authorization": f"Bearer {token()}"}
READ_THEN_SAY = script({"tool_calls": [call("read_document")]}, {"say": "Read it."})
READ_TWICE = script({"tool_calls": [call("read_document")]},
                    {"say": "Once more.", "tool_calls": [call("read_document")]},
                    {"say": "Done."})


def _text(items: list[Any], kind: str = "text-delta", field: str = "delta") -> str:
    return "".join(i[field] for i in items if isinstance(i, dict) and i["type"] == kind)


@contextlib.asynccontextmanager
async def _owner_and_front(document_id: str) -> AsyncIterator[
        tuple[Server, Server, DelayReplyProxy, Client]]:
    """(front, owner, the owner's Redis proxy, a watcher on the owner), one redis-server."""
    async with redis_process() as redis, \
            DelayReplyProxy(redis.port, b'"type":"tool.done"') as proxy, \
            running_server(redis_url=redis.url) as front, \
            running_server(redis_url=proxy.url) as owner, \
            joined(owner, document_id, sub="bob", client_id="watcher") as (watcher, _):
        yield front, owner, proxy, watcher


async def _answered_while_draining(http: httpx.AsyncClient, front: Server,
                                   proxy: DelayReplyProxy, url: str, body: Any
                                   ) -> tuple[int, list[Any]]:
    """POST `body` (an answer) to `front`, which drains after the owner applied it."""
    proxy.armed = True
    posting = asyncio.create_task(sse(http, "POST", url, body))
    await asyncio.wait_for(proxy.fired.wait(), 10)
    await asyncio.sleep(0.3)  # the owner logged the tool.done; its ack waits on the reply
    await drain(front.services, timeout_s=3.0)
    proxy.release.set()
    return await asyncio.wait_for(posting, 15)


def _ai_sdk_answer(prompt: str, first: list[Any]) -> dict[str, Any]:
    tool = next(c for c in first if c != "[DONE]" and c["type"] == "tool-input-available")
    return {"id": "chat", "messages": [user_message(prompt), {
        "id": first[0]["messageId"], "role": "assistant", "parts": [
            {"type": "tool-read_document", "toolCallId": tool["toolCallId"],
             "state": "output-available", "input": {}, "output": {"text": "hi"}}]}]}


@pytest.mark.redis
@pytest.mark.parametrize("then", ["retry", "retry-waiting", "reconnect"])
async def test_ai_sdk_an_answer_applied_while_its_link_was_lost_is_not_lost(then: str
                                                                            ) -> None:
    prompt = READ_TWICE if then == "retry-waiting" else READ_THEN_SAY
    async with _owner_and_front("lost-ai") as (front, owner, proxy, watcher), \
            httpx.AsyncClient(timeout=15) as http:
        chat = f"{owner.http}/v1/ai-sdk/lost-ai/chat"
        status, first = await sse(http, "POST", chat, {
            "id": "chat", "messages": [user_message(prompt)], "tools": [READ]})
        assert status == 200 and first[-2]["finishReason"] == "tool-calls"
        answer = _ai_sdk_answer(prompt, first)
        status, refused = await _answered_while_draining(
            http, front, proxy, f"{front.http}/v1/ai-sdk/lost-ai/chat", answer)
        assert status == 503 and refused[0]["code"] == "unavailable"  # yet applied:
        done = await watcher.recv_until("tool.done")
        assert done["output"] == {"text": "hi"}
        if then != "retry-waiting":
            await watcher.recv_until("run.finished", timeout=15)  # before the frontend is back
        if then == "reconnect":
            status, rest = await sse(http, "GET", f"{chat}/chat/stream")
            assert status == 200 and rest[0] == first[0]  # the whole run, replayed
            assert _text(rest) == "Read it." and rest[-2:] == [
                {"type": "finish", "finishReason": "stop"}, "[DONE]"]
        else:  # the frontend retries its answer: the rest of the run, not a 409
            status, rest = await sse(http, "POST", chat, answer)
            assert status == 200, rest
            assert [c["type"] for c in rest[:3]] == [
                "start", "start-step", "tool-output-available"]
            if then == "retry":
                assert _text(rest) == "Read it." and rest[-2:] == [
                    {"type": "finish", "finishReason": "stop"}, "[DONE]"]
            else:  # still running: up to the next call it asks the frontend for
                assert _text(rest) == "Once more." and rest[-2:] == [
                    {"type": "finish", "finishReason": "tool-calls"}, "[DONE]"]
                assert rest[-4]["type"] == "tool-input-available"
                assert rest[-4]["toolCallId"] != rest[2]["toolCallId"]
            again = await sse(http, "POST", chat, answer)  # delivered now: a repeat
            assert again[0] == 409 and again[1][0]["code"] == "call_not_pending"
        if then != "retry-waiting":  # the end reached the frontend: nothing to replay
            assert (await http.get(f"{chat}/chat/stream", headers=AUTH)).status_code == 204
    assert [e["type"] for e in watcher.events].count("tool.done") == 1  # applied once


@pytest.mark.redis
async def test_agui_an_answer_applied_while_its_link_was_lost_is_streamed_on_retry() -> None:
    def agui(run_id: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
        return {"threadId": "th", "runId": run_id, "state": None, "tools": [READ],
                "context": [], "forwardedProps": {}, "messages": messages}

    user = {"id": "m1", "role": "user", "content": READ_THEN_SAY}
    async with _owner_and_front("lost-agui") as (front, owner, proxy, watcher), \
            httpx.AsyncClient(timeout=15) as http:
        url = f"{owner.http}/v1/agui/lost-agui"
        status, first = await sse(http, "POST", url, agui("a1", [user]))
        assert status == 200 and first[-1]["outcome"]["pendingToolCallIds"]
        call_id = first[-1]["outcome"]["pendingToolCallIds"][0]
        result = {"id": "t1", "role": "tool", "toolCallId": call_id, "content": '{"text": "hi"}'}
        status, refused = await _answered_while_draining(
            http, front, proxy, f"{front.http}/v1/agui/lost-agui", agui("a2", [user, result]))
        assert status == 503 and refused[0]["code"] == "unavailable"
        await watcher.recv_until("run.finished", timeout=15)
        status, rest = await sse(http, "POST", url, agui("a3", [user, result]))
        assert status == 200, rest
        assert rest[0] == {"type": "RUN_STARTED", "threadId": "th", "runId": "a3"}
        assert _text(rest, "TEXT_MESSAGE_CONTENT") == "Read it."
        assert rest[-1] == {"type": "RUN_FINISHED", "threadId": "th", "runId": "a3"}
        again = await sse(http, "POST", url, agui("a4", [user, result]))
        assert again[0] == 409 and again[1][0]["code"] == "call_not_pending"
    assert [e["type"] for e in watcher.events].count("tool.done") == 1


@pytest.mark.redis
async def test_tool_results_a_result_applied_while_its_link_was_lost_is_a_duplicate() -> None:
    async with _owner_and_front("lost-tr") as (front, owner, proxy, watcher), \
            joined(owner, "lost-tr", client_id="tab") as (tab, _), \
            httpx.AsyncClient(timeout=15) as http:
        await start(tab, READ_THEN_SAY)
        tool_call = await tab.recv_until("tool.call")
        path = f"/v1/documents/lost-tr/runs/{tool_call['run_id']}/tool-results"
        body = {"call_id": tool_call["call_id"], "token": tool_call["token"],
                "output": {"text": "hi"}}
        proxy.armed = True
        posting = asyncio.create_task(http.post(front.http + path, json=body, headers=AUTH))
        await asyncio.wait_for(proxy.fired.wait(), 10)
        await asyncio.sleep(0.3)
        await drain(front.services, timeout_s=3.0)
        proxy.release.set()
        first = await posting
        assert first.status_code == 503 and first.json()["code"] == "unavailable"
        await watcher.recv_until("run.finished", timeout=15)
        retried = await http.post(owner.http + path, json=body, headers=AUTH)
        assert (retried.status_code, retried.json()) == (200, {"duplicate": True})
        other = await http.post(owner.http + path, headers=AUTH,
                                json={**body, "output": {"text": "not what it got"}})
        assert other.status_code == 409 and other.json()["code"] == "run_not_active"
        forged = await http.post(owner.http + path, headers=AUTH,
                                 json={**body, "token": tool_call["token"][:-2] + "xx"})
        assert forged.status_code in (403, 409)
    assert [e["type"] for e in watcher.events].count("tool.done") == 1


async def _broken_off(http: httpx.AsyncClient, url: str, body: Any, after: int) -> list[Any]:
    """The first `after` items of a POST's stream; then the frontend goes (a reload)."""
    items: list[Any] = []
    async with http.stream("POST", url, headers=AUTH, json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                items.append(orjson.loads(line[len("data: "):]))
                if len(items) == after:
                    break
    return items


async def _ws_resume(server: Server, document_id: str) -> list[Any]:
    """The chunks (or the `no-active`) that the WebSocket transport's `resume` gets."""
    url = f"ws://127.0.0.1:{server.settings.port}/v1/ai-sdk/{document_id}/ws?token={token()}"
    async with ws_client(url) as client:
        await client.send({"type": "resume", "requestId": "r", "id": "chat"})
        frames: list[Any] = []
        while not frames or frames[-1]["type"] not in ("end", "error", "no-active"):
            frames.append(await client.recv())
    return [f["chunk"] for f in frames if f["type"] == "chunk"] or [frames[-1]["type"]]


@pytest.mark.parametrize("transport", ["sse", "websocket"])
async def test_ai_sdk_a_run_that_ended_while_the_frontend_was_away_is_replayed(
        server: Server, transport: str) -> None:
    """Its stream broke off (a reload, a network drop) and the run ended before the
    frontend reconnected: the reconnect got 204 / `no-active` and lost the rest."""
    slow = script({"say": "x" * 30}, chunk_chars=1, delay_ms=30)
    reconnect: Callable[[], Any]
    chat = f"{server.http}/v1/ai-sdk/away/chat"
    async with joined(server, "away", sub="bob", client_id="watcher") as (watcher, _), \
            httpx.AsyncClient(timeout=15) as http:
        seen = await _broken_off(http, chat, {"id": "chat", "messages": [
            user_message(slow)]}, after=6)
        assert _text(seen) and _text(seen) != "x" * 30
        finished = await watcher.recv_until("run.finished", timeout=15)
        assert finished["status"] == "completed"

        async def sse_reconnect() -> list[Any]:
            status, items = await sse(http, "GET", f"{chat}/chat/stream")
            return items[:-1] if status == 200 else [status]

        async def ws_reconnect() -> list[Any]:
            return await _ws_resume(server, "away")

        reconnect = sse_reconnect if transport == "sse" else ws_reconnect
        replayed = await reconnect()
        assert replayed[0] == seen[0] and _text(replayed) == "x" * 30
        assert replayed[-1] == {"type": "finish", "finishReason": "stop"}
        assert await reconnect() == ([204] if transport == "sse" else ["no-active"])


async def test_ai_sdk_a_run_the_frontend_stopped_is_not_replayed_on_reload(
        server: Server) -> None:
    """Stop (the WebSocket transport's `abort`), then a reload within the window: the
    `resume` got the stopped run replayed as a new message (its end was never streamed,
    so it counted as lost); the frontend asked for no end."""
    slow = script({"say": "x" * 60}, chunk_chars=1, delay_ms=30)
    url = f"ws://127.0.0.1:{server.settings.port}/v1/ai-sdk/stopped/ws?token={token()}"
    async with joined(server, "stopped", sub="bob", client_id="watcher") as (watcher, _):
        async with ws_client(url) as client:
            await client.send({"type": "send", "requestId": "q1", "id": "chat",
                               "messages": [user_message(slow)],
                               "trigger": "submit-message"})
            chunks = 0
            while chunks < 8:
                chunks += (await client.recv())["type"] == "chunk"
            await client.send({"type": "abort", "requestId": "q1"})  # the Stop button
            finished = await watcher.recv_until("run.finished", timeout=15)
        assert finished["status"] == "cancelled"
        assert await _ws_resume(server, "stopped") == ["no-active"]
        async with httpx.AsyncClient(timeout=15) as http:
            status, _ = await sse(http, "GET", f"{server.http}/v1/ai-sdk/stopped/chat/chat/stream")
        assert status == 204


@pytest.mark.redis
async def test_ai_sdk_a_run_that_ended_after_its_log_was_reset_is_replayed() -> None:
    """The frontend's stream broke off, then the document log was reset (Redis lost its
    data) mid-run, and the run ended before the frontend reconnected: 204. It replays
    what the new log holds (the run's start went with the old log: the run is found by
    its record)."""
    slow = script({"say": "x" * 60}, chunk_chars=1, delay_ms=40)
    async with redis_process() as redis, running_server(redis_url=redis.url) as server, \
            httpx.AsyncClient(timeout=15) as http:
        chat = f"{server.http}/v1/ai-sdk/reset-end/chat"
        admin = aioredis.Redis(port=redis.port)
        try:
            seen = await _broken_off(http, chat, {"id": "chat", "messages": [
                user_message(slow)]}, after=6)
            await admin.delete("cw:{reset-end}:meta", "cw:{reset-end}:log")
        finally:
            await admin.aclose()
        for _ in range(300):  # the run goes on after the reset, and ends
            if await server.services.backend.active_run("reset-end") is None:
                break
            await asyncio.sleep(0.05)
        status, replayed = await sse(http, "GET", f"{chat}/chat/stream")
        assert status == 200 and replayed[0] == seen[0]
        assert 0 < len(_text(replayed)) < 60  # from where the new log starts
        assert replayed[-2:] == [{"type": "finish", "finishReason": "stop"}, "[DONE]"]
        assert (await http.get(f"{chat}/chat/stream", headers=AUTH)).status_code == 204
