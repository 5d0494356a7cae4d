"""The OpenAI path: the real `openai` SDK against a local OpenAI-compatible
server, driven end to end over the document WebSocket."""

import asyncio
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest

from tests.fake_openai import FakeOpenAI, Reply, running_fake_openai
from tests.harness import Server, joined, running_server
from tests.runs import answer, of_run, start


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with running_fake_openai() as fake_server:
        yield fake_server


def openai_server(fake: FakeOpenAI, **overrides: Any) -> AbstractAsyncContextManager[Server]:
    return running_server(llm="openai", openai_api_key="sk-test", model="test-model",
                          openai_base_url=fake.base_url, **overrides)


async def test_streaming_text_tool_call_deltas_and_usage(fake: FakeOpenAI) -> None:
    fake.replies = [
        Reply(text=["Let me ", "read it."], tool_calls=[{"name": "read_document",
                                                         "arguments": {}}]),
        Reply(text=["Your doc says ", "hi."], usage=(20, 5)),
    ]
    async with openai_server(fake) as srv, joined(srv) as (client, _):
        context = {"document": {"text": "hi", "version": 3}}
        ack = await start(client, "what does it say?", context=context)
        tool_call = await client.recv_until("tool.call")
        assert tool_call["name"] == "read_document" and tool_call["arguments"] == {}
        await answer(client, tool_call, {"text": "hi"})
        finished = await client.recv_until("run.finished")
        assert finished["status"] == "completed" and finished["steps"] == 2
        assert finished["usage"] == {"prompt_tokens": 31, "completion_tokens": 12,
                                     "total_tokens": 43}
        dones = [e["text"] for e in of_run(client.events, ack["run_id"], "message.done")]
        assert dones == ["Let me read it.", "Your doc says hi."]
    first, second = fake.requests
    assert first["model"] == "test-model" and first["stream"] is True
    assert {t["function"]["name"] for t in first["tools"]} == {
        "read_document", "insert_text", "replace_document", "text_stats"}
    assert first["messages"][0]["role"] == "system"
    assert "what does it say?" in first["messages"][-1]["content"]
    assert "<document (version 3)>" in first["messages"][-1]["content"]
    assistant, tool = second["messages"][-2:]
    assert assistant["tool_calls"][0]["function"]["name"] == "read_document"
    assert tool == {"role": "tool", "tool_call_id": assistant["tool_calls"][0]["id"],
                    "content": '{"text":"hi"}'}


async def test_the_upstream_connection_is_ready_before_the_first_run(fake: FakeOpenAI) -> None:
    """No cold start: the lifespan warms the client, so the first run's request
    reuses a pooled connection opened before any run was asked for."""
    fake.replies = [Reply(text=["warm"])]
    async with openai_server(fake) as srv:
        assert [path for path, _ in fake.peers] == ["/v1/models"]
        async with joined(srv) as (client, _):
            await start(client, "hello", mode="chat")
            finished = await client.recv_until("run.finished")
        assert finished["status"] == "completed"
    (warm_path, warm_port), (run_path, run_port) = fake.peers
    assert (warm_path, run_path) == ("/v1/models", "/v1/chat/completions")
    assert run_port == warm_port


async def test_an_unreachable_upstream_at_start_does_not_stop_the_server() -> None:
    async with running_server(llm="openai", openai_api_key="sk-test",
                              openai_base_url="http://127.0.0.1:9/v1",
                              openai_warmup_timeout_s=0.5) as srv, joined(srv) as (client, _):
        await start(client, "hello", mode="chat")
        finished = await client.recv_until("run.finished")
        assert finished["status"] == "failed"
        assert finished["error"]["code"] == "upstream_error"


async def test_tool_call_arguments_are_validated_before_dispatch(fake: FakeOpenAI) -> None:
    fake.replies = [
        Reply(tool_calls=[{"name": "insert_text", "arguments": {"text": 5}}]),
        Reply(text=["ok"]),
    ]
    async with openai_server(fake) as srv, joined(srv) as (client, _):
        ack = await start(client, "insert something")
        assert (await client.recv_until("run.finished"))["status"] == "completed"
        assert not of_run(client.events, ack["run_id"], "tool.call")
    error = fake.requests[1]["messages"][-1]
    assert error["role"] == "tool" and "invalid arguments for insert_text" in error["content"]


async def test_abort_closes_the_upstream_request(fake: FakeOpenAI) -> None:
    fake.replies = [Reply(text=["Start of a long answer"], stall_after_text=True)]
    async with openai_server(fake) as srv, joined(srv) as (client, _):
        ack = await start(client, "write a lot")
        await client.recv_until("message.delta")
        await asyncio.wait_for(fake.stalled.wait(), 5)
        await client.send({"type": "editor.change"})
        finished = await client.recv_until("run.finished")
        assert finished["status"] == "aborted"
        await asyncio.wait_for(fake.disconnected.wait(), 5)  # the fake saw the disconnect
        partial = [m for m in await srv.services.backend.read_history("doc-1")
                   if m["role"] == "assistant" and m["run_id"] == ack["run_id"]]
        assert partial[0]["content"] == "Start of a long answer" and partial[0]["interrupted"]


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (Reply(http_status=500), "HTTP 500"),
        (Reply(http_status=401), "HTTP 401"),
        (Reply(text=["half"], malformed=True), "malformed"),
    ],
    ids=["server-error", "unauthorized", "malformed-chunk"],
)
async def test_upstream_errors_end_the_run_cleanly(
    fake: FakeOpenAI, reply: Reply, expected: str
) -> None:
    fake.replies = [reply, reply, reply]  # the SDK retries 5xx once
    async with openai_server(fake) as srv, joined(srv) as (client, _):
        await start(client, "hello")
        finished = await client.recv_until("run.finished", timeout=15)
        assert finished["status"] == "failed" and finished["reason"] == "upstream_error"
        assert expected in finished["error"]["message"]
        await client.send({"type": "ping"})  # the session is fine
        await client.recv_until("pong")


async def test_stalled_upstream_ends_with_run_timeout(fake: FakeOpenAI) -> None:
    fake.replies = [Reply(text=["..."], stall_after_text=True)]
    async with openai_server(fake, run_timeout_s=0.5) as srv, joined(srv) as (client, _):
        await start(client, "hello")
        finished = await client.recv_until("run.finished", timeout=5)
        assert finished["status"] == "timed_out" and finished["reason"] == "run_timeout"
        await asyncio.wait_for(fake.disconnected.wait(), 5)


async def test_json_tool_format_for_models_without_function_calling(fake: FakeOpenAI) -> None:
    fake.replies = [
        Reply(text=['{"message": "Reading.", "tool": "read_document", "parameters": {}, ',
                    '"terminate": false}']),
        Reply(text=["not json at all"]),
        Reply(text=['```json\n{"message": "All done.", "tool": null, "terminate": true}\n```']),
    ]
    async with openai_server(fake, tool_format="json") as srv, joined(srv) as (client, _):
        ack = await start(client, "read it")
        tool_call = await client.recv_until("tool.call")
        await answer(client, tool_call, {"text": "abc"})
        finished = await client.recv_until("run.finished")
        assert finished["status"] == "completed" and finished["steps"] == 3
        dones = [e["text"] for e in of_run(client.events, ack["run_id"], "message.done")]
        assert dones == ["Reading.", "All done."]
    assert "tools" not in fake.requests[0]
    assert "read_document" in fake.requests[0]["messages"][0]["content"]
    assert "Result of tool read_document" in fake.requests[1]["messages"][-1]["content"]
    assert "not valid JSON" in fake.requests[2]["messages"][-1]["content"]


async def test_json_tool_format_gives_up_after_three_bad_answers(fake: FakeOpenAI) -> None:
    fake.replies = [Reply(text=["nope"]) for _ in range(4)]
    async with openai_server(fake, tool_format="json") as srv, joined(srv) as (client, _):
        await start(client, "read it")
        finished = await client.recv_until("run.finished")
        assert finished["status"] == "failed" and finished["reason"] == "invalid_model_output"
        assert "could not be parsed 4 times" in finished["error"]["message"]
    assert len(fake.requests) == 4


async def test_json_tool_format_unparsable_last_allowed_answer(fake: FakeOpenAI) -> None:
    """No model call is left to retry in: the run fails for the unparsable answer, with
    an error saying so (it said `max_steps`, as if the model had asked for a tool)."""
    fake.replies = [Reply(text=["this is not the JSON asked for"])]
    async with openai_server(fake, tool_format="json") as srv, joined(srv) as (client, _):
        await start(client, "read it", options={"max_steps": 1})
        finished = await client.recv_until("run.finished")
        assert finished["status"] == "failed" and finished["reason"] == "invalid_model_output"
        assert "last allowed (max_steps 1)" in finished["error"]["message"]
        assert "not valid JSON" in finished["error"]["message"]
    assert len(fake.requests) == 1


async def test_scripted_model_is_the_default_without_a_key(server: Server) -> None:
    """The scripted default stays scripted when no key is configured."""
    assert server.settings.effective_llm == "scripted"
