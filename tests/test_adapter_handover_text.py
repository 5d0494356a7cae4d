"""The text of a run handed over mid-message, as a live AI SDK frontend renders it.

A drain (SIGTERM) of the run's owner hands the run over; the survivor makes the
model call that was streaming again under a new message id, after
`message.discarded`. A replay left the discarded text out, but a frontend
following live showed it twice: the interrupted part, then the whole answer in a
new part. Now a live stream to `ai` 7 (the WebSocket transport, or an SSE request
with `x-cowrite-ai-sdk: 7`) takes the interrupted part back with `reset-step`,
and the real `ai` package's message holds the answer once; a frontend that may be
`ai` 5 or 6 (an SSE request without the header) never gets `reset-step`.
"""

import asyncio
from typing import Any

import httpx
import pytest

from protocol.server import MessageDelta, MessageDiscarded, MessageDone, ToolCall
from server.adapters.ai_sdk_chunks import AiSdkTranslator, discarded_text
from server.lifecycle import drain
from tests.adapter_support import node_json, sse, user_message
from tests.harness import Server, joined, running_server, token, ws_client
from tests.redis_support import redis_process
from tests.runs import call, script

pytestmark = [pytest.mark.redis]
ANSWER = "".join(chr(65 + i % 26) for i in range(60))
RENDER = """
import { readUIMessageStream } from "ai";
const streams = JSON.parse(await new Response(process.stdin).text());
const texts = [];
for (const chunks of streams) {
  const stream = new ReadableStream({
    start(c) { chunks.forEach((x) => c.enqueue(x)); c.close(); } });
  let last;
  for await (const message of readUIMessageStream({ stream })) last = message;
  texts.push(last.parts.filter((p) => p.type === "text").map((p) => p.text));
}
console.log(JSON.stringify(texts));
"""


def rendered(streams: list[list[Any]]) -> list[list[str]]:
    """The text parts of the UI message the real `ai` package builds from each stream."""
    return list(node_json(RENDER, streams, "ai"))


async def _ws_follow(server: Server, document_id: str) -> list[Any]:
    """What `WebSocketChatTransport`'s resume streams, until its end."""
    url = f"ws://127.0.0.1:{server.settings.port}/v1/ai-sdk/{document_id}/ws?token={token()}"
    async with ws_client(url) as client:
        await client.send({"type": "resume", "requestId": "r", "id": "chat"})
        frames: list[Any] = []
        while not frames or frames[-1]["type"] not in ("end", "error", "no-active"):
            frames.append(await client.recv(timeout=30))
    assert frames[-1]["type"] == "end", frames[-1]
    return [f["chunk"] for f in frames if f["type"] == "chunk"]


async def test_ai_sdk_live_followers_show_a_handed_over_answer_once() -> None:
    prompt = script({"say": ANSWER}, chunk_chars=1, delay_ms=40)
    async with redis_process() as redis, running_server(redis_url=redis.url) as one, \
            running_server(redis_url=redis.url) as two, \
            joined(two, "moved", sub="bob", client_id="watcher") as (watcher, _), \
            httpx.AsyncClient(timeout=30) as http:
        chat = f"{one.http}/v1/ai-sdk/moved/chat"
        posted = asyncio.create_task(sse(http, "POST", chat, {
            "id": "chat", "messages": [user_message(prompt)]}))
        await watcher.recv_until("message.delta")
        follow = f"{two.http}/v1/ai-sdk/moved/chat/chat/stream"
        seven = asyncio.create_task(sse(http, "GET", follow, headers={"x-cowrite-ai-sdk": "7"}))
        older = asyncio.create_task(sse(http, "GET", follow))
        socket = asyncio.create_task(_ws_follow(two, "moved"))
        for _ in range(8):
            await watcher.recv_until("message.delta")
        await drain(one.services, timeout_s=5.0)  # SIGTERM: the run moves to `two`
        gone = (await watcher.recv_until("message.discarded", timeout=15))["message_id"]
        answer = (await watcher.recv_until("message.done", timeout=15))["text"]
        assert answer == ANSWER
        await posted
        (status, live7), (status_older, live_older), live_ws = await asyncio.wait_for(
            asyncio.gather(seven, older, socket), 30)
        assert status == status_older == 200
        live7, live_older = live7[:-1], live_older[:-1]  # without "[DONE]"
        assert rendered([live7, live_ws]) == [[answer], [answer]]  # shown once
        assert len(rendered([live_older])[0]) == 2  # ai 5 and 6: the interrupted part stays
        for live in (live7, live_ws):  # the interrupted text went live, then was taken back
            kinds = [(c["type"], c.get("id")) for c in live]
            assert ("text-delta", gone) in kinds
            assert kinds.index(("text-end", gone)) + 1 == kinds.index(("reset-step", None))
        assert not [c for c in live_older if c["type"] == "reset-step"]  # ai 5 and 6


def test_a_replay_leaves_out_the_discarded_text_and_its_reset() -> None:
    """What a reconnect made after the move replays (`discarded_text`): neither the
    interrupted text nor the `reset-step` that took it back (it would take back
    nothing, or, in `ai` 5 and 6, fail the chat). The text of an earlier model call
    (its calls all invalid: no tool events) ends its step, so the interrupted text is
    all its own step holds; a step holding more than the interrupted text (a call
    shown after it) is not reset live: `reset-step` would take the call too."""
    delta = MessageDelta(run_id="r", message_id="m1", delta="Hel")
    gone = MessageDiscarded(run_id="r", message_id="m1")
    again = MessageDelta(run_id="r", message_id="m1.r1", delta="Hello")
    translator = AiSdkTranslator("r")
    live = [c for e in (delta, gone, again) for c in translator.translate(e, False)[0]]
    assert [(c["type"], c.get("id")) for c in live] == [
        ("start-step", None), ("text-start", "m1"), ("text-delta", "m1"), ("text-end", "m1"),
        ("reset-step", None), ("text-start", "m1.r1"), ("text-delta", "m1.r1")]
    assert translator.translate(gone, False) == ([], False)  # once
    dropping: set[str] = set()
    replay = [c for c in live if not discarded_text(c, translator.discarded, dropping)]
    assert replay == [live[0], *live[5:]]
    after_text = AiSdkTranslator("r")
    shown = MessageDone(run_id="r", message_id="m0", text="Before.")
    moved = [c for e in (shown, delta, gone) for c in after_text.translate(e, False)[0]]
    assert [(c["type"], c.get("id")) for c in moved] == [
        ("start-step", None), ("text-start", "m0"), ("text-delta", "m0"), ("text-end", "m0"),
        ("finish-step", None), ("start-step", None), ("text-start", "m1"),
        ("text-delta", "m1"), ("text-end", "m1"), ("reset-step", None)]
    with_call = AiSdkTranslator("r")
    shown_call = ToolCall(run_id="r", call_id="c1", name="t", arguments={}, executor="server")
    for event in (delta, shown_call):
        with_call.translate(event, False)
    assert with_call.translate(gone, False) == ([], False)


async def test_ai_sdk_text_after_invalid_calls_is_its_own_step_when_handed_over() -> None:
    """A model call whose tool calls were all invalid (an unknown tool) publishes no
    tool events, so the next model call's text followed in the same UI step: handed
    over mid-text, that step held both texts, no `reset-step` came, and a live `ai` 7
    frontend kept the interrupted part that a replay leaves out. Each model call's
    text now opens its own step, so live and replay render the same message."""
    prompt = script({"say": "Checking.", "tool_calls": [call("no_such_tool")]},
                    {"say": ANSWER}, chunk_chars=1, delay_ms=40)
    async with redis_process() as redis, running_server(redis_url=redis.url) as one, \
            running_server(redis_url=redis.url) as two, \
            joined(two, "bad", sub="bob", client_id="watcher") as (watcher, _), \
            httpx.AsyncClient(timeout=30) as http:
        posted = asyncio.create_task(sse(http, "POST", f"{one.http}/v1/ai-sdk/bad/chat", {
            "id": "chat", "messages": [user_message(prompt)]}))
        await watcher.recv_until(lambda e: e.get("type") == "message.delta"
                                 and e["message_id"].endswith(":m2"))
        follow = f"{two.http}/v1/ai-sdk/bad/chat/chat/stream"
        seven = asyncio.create_task(sse(http, "GET", follow, headers={"x-cowrite-ai-sdk": "7"}))
        socket = asyncio.create_task(_ws_follow(two, "bad"))
        for _ in range(8):
            await watcher.recv_until("message.delta")
        await drain(one.services, timeout_s=5.0)  # SIGTERM: the run moves to `two`
        gone = (await watcher.recv_until("message.discarded", timeout=15))["message_id"]
        replay = asyncio.create_task(sse(http, "GET", follow, headers={"x-cowrite-ai-sdk": "7"}))
        await watcher.recv_until("run.finished", timeout=15)
        await posted
        (status, live7), live_ws, (status_replay, replayed) = await asyncio.wait_for(
            asyncio.gather(seven, socket, replay), 30)
        assert status == status_replay == 200
        live7, replayed = live7[:-1], replayed[:-1]  # without "[DONE]"
        assert rendered([live7, live_ws, replayed]) == [["Checking.", ANSWER]] * 3
        for live in (live7, live_ws):  # the interrupted text went live, then was taken back
            kinds = [(c["type"], c.get("id")) for c in live]
            assert ("text-delta", gone) in kinds
            assert kinds.index(("text-end", gone)) + 1 == kinds.index(("reset-step", None))
