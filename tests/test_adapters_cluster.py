"""AI SDK and AG-UI chats behind a load balancer that is not sticky: a chat's run
started through one instance is answered, followed and reconnected to through
another (two real `python -m server` processes on one real redis-server)."""

import asyncio
import signal
from typing import Any

import httpx
import pytest

from bench.common import Proc
from protocol.server import MessageDelta, MessageDiscarded
from server.adapters.agui_events import AguiTranslator
from server.adapters.ai_sdk_chunks import AiSdkTranslator
from tests.adapter_support import sse, user_message
from tests.cluster_support import FAST_LEASE, cluster, join, killed
from tests.harness import token, ws_client
from tests.runs import READ, REPLACE_DOC, call, script

pytestmark = [pytest.mark.redis, pytest.mark.slow]
TAKEOVER_S = 15  # the lease (1 s) + a janitor tick, on a loaded 2-core machine


def _auth(sub: str = "alice") -> dict[str, str]:
    return {"Authorization": f"Bearer {token(sub)}"}


def _chat(proc: Proc, document_id: str) -> str:
    return proc.url(f"/v1/ai-sdk/{document_id}/chat", "http")


def _text(chunks: list[Any]) -> str:
    return "".join(c["delta"] for c in chunks if isinstance(c, dict) and c["type"] == "text-delta")


async def test_ai_sdk_chat_continues_and_reconnects_through_the_other_instance() -> None:
    prompt = script({"say": "Reading.", "tool_calls": [call("read_document")]},
                    {"say": "Read it.", "tool_calls": [call("replace_document", text="New")]},
                    {"say": "Done."})
    async with cluster() as (_, (one, two)), \
            join(one, "doc-x", sub="bob", client_id="watcher") as (watcher, _), \
            httpx.AsyncClient() as http:
        status, first = await sse(http, "POST", _chat(one, "doc-x"), {
            "id": "chat1", "messages": [user_message(prompt)], "tools": [READ, REPLACE_DOC]})
        assert status == 200 and first[-2:] == [{"type": "finish", "finishReason": "tool-calls"},
                                                "[DONE]"]
        started = await watcher.recv_until("run.started")
        assert first[0] == {"type": "start", "messageId": started["run_id"]}

        # A reconnect through the other instance replays what the first one streamed.
        status, replayed = await sse(http, "GET", f"{_chat(two, 'doc-x')}/chat1/stream")
        assert status == 200 and replayed == first
        assert (await http.get(f"{_chat(two, 'doc-x')}/chat1/stream",
                               headers=_auth("carol"))).status_code == 204

        tool = first[-4]
        assert tool["type"] == "tool-input-available" and tool["toolName"] == "read_document"
        assistant = {"id": first[0]["messageId"], "role": "assistant", "parts": [
            {"type": "tool-read_document", "toolCallId": tool["toolCallId"],
             "state": "output-available", "input": {}, "output": {"text": "hi"}}]}
        body = {"id": "chat1", "messages": [user_message(prompt), assistant]}
        refused = await sse(http, "POST", _chat(two, "doc-x"), body, sub="carol")
        assert refused[0] == 403 and refused[1][0]["code"] == "forbidden"

        status, rest = await sse(http, "POST", _chat(two, "doc-x"), body)
        assert status == 200 and rest[0] == first[0]  # the same assistant message goes on
        assert _text(rest) == "Read it."
        assert rest[-4]["type"] == "tool-approval-request" and rest[-2]["finishReason"] == \
            "tool-calls"
        done = await watcher.recv_until("tool.done")
        assert done["call_id"] == tool["toolCallId"] and done["output"] == {"text": "hi"}
        # The first instance followed the answered run too. A replay leaves out the
        # answered call's `tool-input-available` (the SDK would run the tool again).
        asked_again = {"type": "tool-input-available", "toolCallId": tool["toolCallId"]}
        expected = [c for c in first[:-1] + rest if not (
            isinstance(c, dict) and asked_again.items() <= c.items())]
        for proc in (one, two):
            status, replayed = await sse(http, "GET", f"{_chat(proc, 'doc-x')}/chat1/stream")
            assert status == 200 and replayed == expected

        # The approval is answered through the first instance, which saw the run go on.
        call_id = rest[-4]["toolCallId"]
        approving = {"id": first[0]["messageId"], "role": "assistant", "parts": [
            *assistant["parts"],
            {"type": "tool-replace_document", "toolCallId": call_id, "input": {"text": "New"},
             "state": "approval-responded", "approval": {"id": call_id, "approved": True}}]}
        status, approved = await sse(http, "POST", _chat(one, "doc-x"), {
            "id": "chat1", "messages": [user_message(prompt), approving]})
        assert status == 200 and approved[0] == first[0]
        assert [c["type"] for c in approved[1:-1]] == [
            "tool-approval-response", "tool-input-available", "finish"]

        # ... and the tool's output through the second again, which followed it too.
        replaced = {**approving, "parts": [*assistant["parts"], {
            **approving["parts"][1], "state": "output-available", "output": {"ok": True}}]}
        status, last = await sse(http, "POST", _chat(two, "doc-x"), {
            "id": "chat1", "messages": [user_message(prompt), replaced]})
        assert status == 200 and _text(last) == "Done." and last[-2:] == [
            {"type": "finish", "finishReason": "stop"}, "[DONE]"]
        finished = await watcher.recv_until("run.finished")
        assert finished["run_id"] == started["run_id"] and finished["status"] == "completed"
        assert [e["type"] for e in watcher.events].count("tool.done") == 2
        assert [e["type"] for e in watcher.events].count("run.started") == 1
        for proc in (one, two):  # both instances let the finished chat go
            assert (await http.get(f"{_chat(proc, 'doc-x')}/chat1/stream",
                                   headers=_auth())).status_code == 204
        again = await sse(http, "POST", _chat(two, "doc-x"), body)
        assert again[0] == 409 and again[1][0]["code"] == "call_not_pending"


async def test_ai_sdk_websocket_resume_through_the_other_instance() -> None:
    prompt = script({"say": "Reading.", "tool_calls": [call("read_document")]}, {"say": "Ok."})
    async with cluster() as (_, (one, two)), httpx.AsyncClient() as http:
        status, first = await sse(http, "POST", _chat(one, "doc-w"), {
            "id": "chat2", "messages": [user_message(prompt)], "tools": [READ]})
        assert status == 200
        url = two.url("/v1/ai-sdk/doc-w/ws") + f"?token={token('alice')}"
        async with ws_client(url) as ws:
            await ws.send({"type": "resume", "requestId": "r1", "id": "chat2",
                           "lastSequence": 1})
            chunks = first[:-1]  # without "[DONE]"
            frames = [await ws.recv() for _ in range(1 + len(chunks) - 2)]
            assert frames[0] == {"type": "start", "requestId": "r1"}
            assert [f["chunk"] for f in frames[1:]] == chunks[2:]  # after sequence 1
            assert [f["sequence"] for f in frames[1:]] == list(range(len(chunks) - 2))
            assert await ws.recv() == {"type": "end", "requestId": "r1"}
            await ws.send({"type": "resume", "requestId": "r2", "id": "no-such-chat"})
            assert await ws.recv() == {"type": "no-active", "requestId": "r2"}


async def test_agui_thread_continues_through_the_other_instance() -> None:
    prompt = script({"say": "Reading.", "tool_calls": [call("read_document")]}, {"say": "Fine."})
    base = {"threadId": "t1", "state": {}, "context": [], "forwardedProps": {},
            "tools": [{"name": "read_document", "description": "Read.",
                       "parameters": READ["parameters"]}]}
    user = {"id": "m1", "role": "user", "content": prompt}
    async with cluster() as (_, (one, two)), \
            join(one, "doc-g", sub="bob", client_id="w") as (watcher, _), \
            httpx.AsyncClient() as http:
        _, events = await sse(http, "POST", one.url("/v1/agui/doc-g", "http"),
                               {**base, "runId": "agui-1", "messages": [user]})
        call_id = events[-2]["toolCallId"]
        assert events[-1]["outcome"] == {"type": "success", "pendingToolCallIds": [call_id]}
        messages = [user, {"id": "m2", "role": "assistant", "toolCalls": [
            {"id": call_id, "type": "function",
             "function": {"name": "read_document", "arguments": "{}"}}]},
            {"id": "m3", "role": "tool", "toolCallId": call_id, "content": '{"text": "doc"}'}]
        _, rest = await sse(http, "POST", two.url("/v1/agui/doc-g", "http"),
                             {**base, "runId": "agui-2", "messages": messages})
        assert [e["type"] for e in rest] == [
            "RUN_STARTED", "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_CONTENT",
            "TEXT_MESSAGE_END", "RUN_FINISHED"]
        assert rest[0]["runId"] == rest[-1]["runId"] == "agui-2"
        assert (await watcher.recv_until("tool.done"))["output"] == {"text": "doc"}
        finished = await watcher.recv_until("run.finished")
        assert finished["run_id"] == "agui-1" and finished["status"] == "completed"


async def test_ai_sdk_chat_outlives_the_instance_that_started_it() -> None:
    prompt = script({"say": "Reading.", "tool_calls": [call("read_document")]},
                    {"say": "Read it."})
    async with cluster(env=FAST_LEASE) as (_, (one, two)), \
            join(two, "doc-k", sub="bob", client_id="watcher") as (watcher, _), \
            httpx.AsyncClient() as http:
        status, first = await sse(http, "POST", _chat(one, "doc-k"), {
            "id": "chat3", "messages": [user_message(prompt)], "tools": [READ]})
        assert status == 200 and first[-2]["finishReason"] == "tool-calls"
        await killed(one)  # kill -9 while the run waits on the frontend's tool

        tool = first[-4]
        assistant = {"id": first[0]["messageId"], "role": "assistant", "parts": [
            {"type": "tool-read_document", "toolCallId": tool["toolCallId"],
             "state": "output-available", "input": {}, "output": {"text": "hi"}}]}
        status, rest = await sse(http, "POST", _chat(two, "doc-k"), {
            "id": "chat3", "messages": [user_message(prompt), assistant]})
        assert status == 200 and rest[0] == first[0]  # the answer waited for the takeover
        assert _text(rest) == "Read it." and rest[-2:] == [
            {"type": "finish", "finishReason": "stop"}, "[DONE]"]
        resumed = await watcher.recv_until("run.resumed", timeout=TAKEOVER_S)
        assert resumed["reason"] == "owner_lost"
        finished = await watcher.recv_until("run.finished", timeout=TAKEOVER_S)
        assert finished["status"] == "completed"
        assert [e["type"] for e in watcher.events].count("tool.call") == 1


async def test_a_handed_over_run_shows_its_answer_once() -> None:
    """SIGTERM on the run's owner mid-text: the run is handed over and its model call
    made again under a new message id, after `message.discarded`. A reconnect used to
    replay the discarded partial text and then the whole text (shown twice), and a live
    stream left the discarded part open until the run's end."""
    prompt = script({"say": "".join(chr(65 + i % 26) for i in range(80))}, chunk_chars=1,
                    delay_ms=50)
    async with cluster() as (_, (one, two)), \
            join(two, "doc-h", sub="bob", client_id="watcher") as (watcher, _), \
            httpx.AsyncClient() as http:
        posted = asyncio.create_task(sse(http, "POST", _chat(one, "doc-h"), {
            "id": "chat5", "messages": [user_message(prompt)]}))
        started = await watcher.recv_until("run.started")
        await watcher.recv_until("message.delta")
        live = asyncio.create_task(sse(http, "GET", f"{_chat(two, 'doc-h')}/chat5/stream"))
        for _ in range(5):
            await watcher.recv_until("message.delta")
        one.process.send_signal(signal.SIGTERM)
        discarded = await watcher.recv_until("message.discarded", timeout=TAKEOVER_S)
        gone = discarded["message_id"]
        status, replay = await sse(http, "GET", f"{_chat(two, 'doc-h')}/chat5/stream")
        assert status == 200 and replay[0] == {"type": "start", "messageId": started["run_id"]}
        assert not [c for c in replay if isinstance(c, dict) and c.get("id") == gone]
        assert _text(replay) == (await watcher.recv_until("message.done"))["text"]
        assert replay[-2:] == [{"type": "finish", "finishReason": "stop"}, "[DONE]"]
        # The live follower: the discarded part ends there, the answer follows in a new one.
        status, followed = await live
        kinds = [(c["type"], c.get("id")) for c in followed if isinstance(c, dict)]
        ended = kinds.index(("text-end", gone))
        assert ended < min(i for i, (kind, text_id) in enumerate(kinds)
                           if kind == "text-start" and text_id != gone)
        assert followed[-2:] == [{"type": "finish", "finishReason": "stop"}, "[DONE]"]
        # The frontend on the drained instance: an error telling it to reconnect.
        status, first = await posted
        assert status == 200 and first[-4]["errorText"].startswith(
            "connection to the document lost (server shutting down")


def test_a_live_stream_ends_the_discarded_message() -> None:
    """What a live frontend sees of `message.discarded` (the run moved mid-text): the
    discarded message ends; the AI SDK's `reset-step` takes its text back (left out
    by `Segment` for frontends that do not say they run `ai` 7), AG-UI's translator
    keeps a marker that each response turns into a `MESSAGES_SNAPSHOT` without it
    (tests/test_agui_handover_text.py); the answer follows in a new message."""
    delta = MessageDelta(run_id="r", message_id="m1", delta="Hel")
    gone = MessageDiscarded(run_id="r", message_id="m1")
    again = MessageDelta(run_id="r", message_id="m1.r1", delta="Hello")
    ai_sdk = AiSdkTranslator("r")
    chunks = [c for e in (delta, gone, again) for c in ai_sdk.translate(e, False)[0]]
    assert [(c["type"], c.get("id")) for c in chunks] == [
        ("start-step", None), ("text-start", "m1"), ("text-delta", "m1"), ("text-end", "m1"),
        ("reset-step", None), ("text-start", "m1.r1"), ("text-delta", "m1.r1")]
    assert ai_sdk.translate(gone, False) == ([], False)  # once
    agui = AguiTranslator("t", "r")
    events = [e.type for x in (delta, gone, again) for e in agui.translate(x, False)[0]]
    assert events == ["TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END",
                      "CUSTOM", "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT"]
    assert agui.translate(gone, False) == ([], False)  # once


async def test_a_moved_chat_waits_for_its_frontend_longer_than_the_client_grace() -> None:
    """An adapter's frontend attaches per request, so on the instance a run moved to it
    is never connected between requests: the run counted it gone and ended it
    `aborted`/`client_gone` after COWRITE_CLIENT_GRACE_S (a user reading an approval
    prompt through a rolling deploy lost the run). The tool timeout bounds the wait."""
    prompt = script({"say": "Reading.", "tool_calls": [call("read_document")]},
                    {"say": "Read it."})
    env = {**FAST_LEASE, "COWRITE_CLIENT_GRACE_S": "1"}
    async with cluster(env=env) as (_, (one, two)), \
            join(two, "doc-g", sub="bob", client_id="watcher") as (watcher, _), \
            httpx.AsyncClient() as http:
        status, first = await sse(http, "POST", _chat(one, "doc-g"), {
            "id": "chat5", "messages": [user_message(prompt)], "tools": [READ]})
        assert status == 200 and first[-2]["finishReason"] == "tool-calls"
        await killed(one)
        resumed = await watcher.recv_until("run.resumed", timeout=TAKEOVER_S)
        assert resumed["reason"] == "owner_lost"
        await asyncio.sleep(3)  # three times the client grace, the user still thinking
        tool = first[-4]
        assistant = {"id": first[0]["messageId"], "role": "assistant", "parts": [
            {"type": "tool-read_document", "toolCallId": tool["toolCallId"],
             "state": "output-available", "input": {}, "output": {"text": "hi"}}]}
        status, rest = await sse(http, "POST", _chat(two, "doc-g"), {
            "id": "chat5", "messages": [user_message(prompt), assistant]})
        assert status == 200 and _text(rest) == "Read it."  # was 409: ended client_gone
        finished = await watcher.recv_until("run.finished", timeout=TAKEOVER_S)
        assert finished["status"] == "completed"
