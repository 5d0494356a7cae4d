"""Answers in flight when the instance holding the run drains or the log is reset.

test_adapter_lost_answers.py drains the instance the answer reached while the run
is another's (the answer's request is answered `503`). Here the answer reaches
the run's own instance, which drains (SIGTERM: the run is handed over to the
survivor) or whose document log is reset while the request waits for the run's
ack (held at Redis). The ack comes first there (it follows the answer's
`tool.done` through the link), so the request streams the tool's output, then the
error that says to reconnect; the run ends before the frontend is back. Its retry
of the same answer on the survivor streams the rest (it was a 409 before answers
were redelivered), and so does its reconnect.
"""

import asyncio
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from server.lifecycle import drain
from tests.adapter_support import sse, user_message
from tests.harness import joined, running_server, token
from tests.kill_proxy import DelayReplyProxy
from tests.redis_support import redis_process
from tests.runs import READ, call, script

pytestmark = [pytest.mark.redis]
AUTH = {"Authorization": f"Bearer {token()}"}
READ_THEN_SAY = script({"tool_calls": [call("read_document")]}, {"say": "Read it."})


def _text(items: list[Any]) -> str:
    return "".join(i["delta"] for i in items if isinstance(i, dict) and i["type"] == "text-delta")


def _answer(first: list[Any]) -> dict[str, Any]:
    tool = next(c for c in first if c != "[DONE]" and c["type"] == "tool-input-available")
    return {"id": "chat", "messages": [user_message(READ_THEN_SAY), {
        "id": first[0]["messageId"], "role": "assistant", "parts": [
            {"type": "tool-read_document", "toolCallId": tool["toolCallId"],
             "state": "output-available", "input": {}, "output": {"text": "hi"}}]}]}


async def _answer_held(http: httpx.AsyncClient, chat: str, proxy: DelayReplyProxy
                       ) -> tuple[dict[str, Any], "asyncio.Task[tuple[int, list[Any]]]"]:
    """The chat's run asks for a tool; the answer is posted and its `tool.done` logged,
    the reply to that write held at the proxy: the answer, its request still waiting."""
    status, first = await sse(http, "POST", chat, {
        "id": "chat", "messages": [user_message(READ_THEN_SAY)], "tools": [READ]})
    assert status == 200 and first[-2]["finishReason"] == "tool-calls"
    answer = _answer(first)
    proxy.armed = True
    posting = asyncio.create_task(sse(http, "POST", chat, answer))
    await asyncio.wait_for(proxy.fired.wait(), 10)
    await asyncio.sleep(0.3)  # the tool.done is logged; the owner waits on the reply
    return answer, posting


@pytest.mark.parametrize("then", ["retry", "reconnect"])
async def test_ai_sdk_an_answer_in_flight_when_its_owner_drains(then: str) -> None:
    async with redis_process() as redis, \
            DelayReplyProxy(redis.port, b'"type":"tool.done"') as proxy, \
            running_server(redis_url=proxy.url) as owner, \
            running_server(redis_url=redis.url) as survivor, \
            joined(survivor, "hand", sub="bob", client_id="watcher") as (watcher, _), \
            httpx.AsyncClient(timeout=15) as http:
        chat = f"{owner.http}/v1/ai-sdk/hand/chat"
        answer, posting = await _answer_held(http, chat, proxy)
        draining = asyncio.create_task(drain(owner.services, timeout_s=3.0))
        await asyncio.sleep(0.3)
        proxy.release.set()
        status, cut = await asyncio.wait_for(posting, 15)
        await asyncio.wait_for(draining, 15)
        assert status == 200 and cut[2]["type"] == "tool-output-available"
        assert cut[-4]["errorText"].startswith("connection to the document lost (server")
        done = await watcher.recv_until("tool.done")
        assert done["output"] == {"text": "hi"}
        await watcher.recv_until("run.finished", timeout=15)
        there = f"{survivor.http}/v1/ai-sdk/hand/chat"
        if then == "retry":
            status, rest = await sse(http, "POST", there, answer)
            assert status == 200, rest
            assert _text(rest) == "Read it." and rest[-2:] == [
                {"type": "finish", "finishReason": "stop"}, "[DONE]"]
        else:
            status, rest = await sse(http, "GET", f"{there}/chat/stream")
            assert status == 200, rest
            assert _text(rest) == "Read it." and rest[-2:] == [
                {"type": "finish", "finishReason": "stop"}, "[DONE]"]
    assert [e["type"] for e in watcher.events].count("tool.done") == 1


async def test_ai_sdk_an_answer_in_flight_when_the_log_is_reset() -> None:
    """The reset erased the answer's events: a retry is a 409 (README), the reconnect
    replays the run from where the new log starts, to its end."""
    async with redis_process() as redis, \
            DelayReplyProxy(redis.port, b'"type":"tool.done"') as proxy, \
            running_server(redis_url=proxy.url) as owner, \
            httpx.AsyncClient(timeout=15) as http:
        chat = f"{owner.http}/v1/ai-sdk/reset/chat"
        _, posting = await _answer_held(http, chat, proxy)
        admin = aioredis.Redis(port=redis.port)
        try:
            await admin.delete("cw:{reset}:meta", "cw:{reset}:log")
            await asyncio.sleep(1.0)  # the ack still waits on the held reply
        finally:
            await admin.aclose()
        proxy.release.set()
        status, cut = await asyncio.wait_for(posting, 15)
        assert status == 200 and cut[-4]["errorText"] == (
            "connection to the document lost (document log reset); reconnect")
        for _ in range(300):
            if await owner.services.backend.active_run("reset") is None:
                break
            await asyncio.sleep(0.05)
        status, rest = await sse(http, "GET", f"{chat}/chat/stream")
        assert status == 200, rest
        assert _text(rest) == "Read it." and rest[-2:] == [
            {"type": "finish", "finishReason": "stop"}, "[DONE]"]
        assert (await http.get(f"{chat}/chat/stream", headers=AUTH)).status_code == 204
