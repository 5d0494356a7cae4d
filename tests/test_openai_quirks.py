"""An OpenAI-compatible server that misbehaves: answers cut short or filtered, no stream
at all, malformed chunks, quirky tool calls and usage, errors inside the stream, a
provider quoting the API key. The real `openai` SDK against tests/fake_openai.py."""

from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from tests.fake_openai import FakeOpenAI, Reply, chunk, running_fake_openai
from tests.harness import joined, logged, running_server
from tests.runs import answer, start

KEY = "sk-live-QUOTEDKEY0123456789"


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with running_fake_openai() as fake_server:
        yield fake_server


async def run_once(fake: FakeOpenAI, *replies: Reply, mode: str = "chat", **settings: Any
                   ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One run against `replies`: its run.finished and every event the client saw."""
    fake.replies = list(replies)
    async with running_server(llm="openai", openai_api_key=KEY, model="test-model",
                              openai_base_url=fake.base_url, **settings) as srv, \
            joined(srv) as (client, _):
        await start(client, "hello", mode=mode)
        while True:
            event = await client.recv_until(lambda e: e.get("type") in ("tool.call",
                                                                        "run.finished"))
            if event["type"] == "run.finished":
                return event, client.events
            await answer(client, event, {"text": "doc"})


def failed_with(finished: dict[str, Any], words: str, kind: str = "bad_request") -> None:
    assert (finished["status"], finished["reason"]) == ("failed", "upstream_error"), finished
    assert finished["error"]["code"] == "upstream_error"
    assert words in finished["error"]["message"], finished["error"]
    assert finished["error"]["details"]["kind"] == kind


@pytest.mark.parametrize(("finish", "words"), [
    ("length", "cut at its length limit"),
    ("content_filter", "withheld the rest of the answer"),
    (None, "ended early"),
])
async def test_an_answer_cut_short_fails_the_run_and_keeps_its_text_interrupted(
        fake: FakeOpenAI, finish: str | None, words: str) -> None:
    events: list[Any] = [chunk({"role": "assistant", "content": "The answer is cut"})]
    if finish is not None:
        events.append(chunk({}, finish))
    events.append("[DONE]")
    finished, seen = await run_once(fake, Reply(events=events), Reply(text=["next"]))
    # each ended `completed`, the partial text saved as a whole answer
    failed_with(finished, words, "connection" if finish is None else "bad_request")
    assert "".join(e["delta"] for e in seen if e["type"] == "message.delta") == \
        "The answer is cut"


@pytest.mark.parametrize("reply", [
    Reply(body=b'{"id": "x", "object": "chat.completion", "choices": [{"index": 0, '
               b'"message": {"role": "assistant", "content": "whole"}, '
               b'"finish_reason": "stop"}]}'),
    Reply(body=b"<html><body>Welcome to nginx!</body></html>", content_type="text/html"),
], ids=["not-streamed", "html-page"])
async def test_a_server_that_does_not_stream_fails_the_run(fake: FakeOpenAI, reply: Reply
                                                           ) -> None:
    finished, _ = await run_once(fake, reply)  # were `completed`, with nothing said
    failed_with(finished, "did not stream its answer")


@pytest.mark.parametrize("events", [
    [chunk({"content": "x"}), "{\"id\": \"q\", \"object\": \"chat.completion.chunk\", "
     "\"created\": 0, \"model\": \"m\", \"choices\": [\"x\"]}", "[DONE]"],
    [chunk({"content": "", "tool_calls": [
        {"index": 0, "id": "a", "type": "function", "function": {"name": "t", "arguments": ""}},
        {"id": "b", "type": "function", "function": {"name": "u", "arguments": ""}}]}),
     chunk({}, "tool_calls"), "[DONE]"],
], ids=["choice-not-an-object", "tool-call-without-index-beside-one-with"])
async def test_a_malformed_chunk_is_an_upstream_error_not_an_internal_one(
        fake: FakeOpenAI, events: list[Any]) -> None:
    finished, _ = await run_once(fake, Reply(events=events), mode="agent")
    # was failed/internal_error with a traceback
    assert finished.get("reason") in (None, "upstream_error"), finished


async def test_tool_calls_without_index_are_separate_calls(fake: FakeOpenAI) -> None:
    calls = [chunk({"content": "", "tool_calls": [{"id": f"call_{n}", "type": "function",
                                                    "function": {"name": "read_document",
                                                                 "arguments": "{}"}}]})
             for n in (1, 2)]
    finished, seen = await run_once(
        fake, Reply(events=[*calls, chunk({}, "tool_calls"), "[DONE]"]), Reply(text=["ok"]),
        mode="agent")
    assert finished["status"] == "completed"
    names = [e["name"] for e in seen if e["type"] == "tool.call"]
    assert names == ["read_document", "read_document"]  # was one "read_documentread_document"


async def test_usage_repeated_on_every_chunk_counts_once(fake: FakeOpenAI) -> None:
    def usage(done: int) -> dict[str, int]:
        return {"prompt_tokens": 10, "completion_tokens": done, "total_tokens": 10 + done}

    events: list[Any] = [chunk({"content": f"{n} "}, usage=usage(n)) for n in range(1, 6)]
    events += [chunk({}, "stop", usage=usage(5)), chunk(None, usage={
        "prompt_tokens": 10, "completion_tokens": None, "total_tokens": 15}), "[DONE]"]
    finished, _ = await run_once(fake, Reply(events=events))
    assert finished["status"] == "completed"  # a null count was a TypeError: internal_error
    # the last report counts (the sum of six was 60 / 20 / 80), a null count as 0
    assert finished["usage"] == {"prompt_tokens": 10, "completion_tokens": 0,
                                 "total_tokens": 15}


async def test_an_error_inside_the_stream_keeps_its_kind(fake: FakeOpenAI) -> None:
    events = [chunk({"content": "partial "}),
              {"error": {"message": "Upstream overloaded", "code": 503}}]
    finished, _ = await run_once(fake, Reply(events=events))
    failed_with(finished, "server error", "server_error")  # was kind bad_request


async def test_a_provider_quoting_the_key_does_not_put_it_in_the_log(fake: FakeOpenAI) -> None:
    body = {"error": {"message": f"Incorrect API key provided: {KEY}", "type": "auth"}}
    with logged("cowrite.agent") as lines:
        finished, _ = await run_once(fake, Reply(http_status=401, error_body=body),
                                     Reply(http_status=401, error_body=body))
    failed_with(finished, "HTTP 401", "auth")
    text = "\n".join(lines)
    assert "Incorrect API key provided" in text  # the provider's words are logged,
    assert KEY not in text and KEY[:12] not in text  # its key is not


async def test_a_silent_upstream_fails_after_the_configured_timeout(fake: FakeOpenAI) -> None:
    """`COWRITE_OPENAI_TIMEOUT_S` (it was a fixed 120 s): the request and its one retry
    each go silent after some text; the run fails `timeout`, its text kept."""
    stalls = Reply(text=["partial "], stall_after_text=True)
    finished, _ = await run_once(fake, stalls, stalls, openai_timeout_s=0.5)
    failed_with(finished, "timeout", "timeout")


async def test_a_long_thread_sends_only_what_fits_the_history_budget(fake: FakeOpenAI) -> None:
    """Earlier turns are cut to `COWRITE_HISTORY_MAX_CHARS`, newest first: a thread of
    long answers used to fill the model's context until every run failed HTTP 400."""
    answers = [f"answer {n}: " + chr(ord("a") + n) * 5_000 for n in range(4)]
    fake.replies = [Reply(text=[answer]) for answer in answers] + [Reply(text=["short"])]
    async with running_server(llm="openai", openai_api_key=KEY, model="test-model",
                              openai_base_url=fake.base_url, history_max_chars=4_000) as srv, \
            joined(srv) as (client, _):
        for n in range(5):
            await start(client, f"question {n}", mode="chat")
            finished = await client.recv_until("run.finished")
            assert finished["status"] == "completed"
    earlier = fake.requests[-1]["messages"][1:-1]  # between the system prompt and the prompt
    assert sum(len(m["content"]) for m in earlier) <= 4_000
    assert [m["role"] for m in earlier] == ["user", "assistant"] * (len(earlier) // 2)
    assert earlier[-2]["content"] == "question 3" and earlier[-1]["content"].startswith(
        "answer 3: ddd")  # the newest turn, its start and end kept
    assert "characters left out" in earlier[-1]["content"]
    assert earlier[-1]["content"].endswith("ddd")


async def test_a_stream_is_taken_whatever_the_case_of_its_content_type(fake: FakeOpenAI) -> None:
    body = b"".join(b"data: " + orjson.dumps(event) + b"\n\n" for event in (
        chunk({"content": "fine"}), chunk({}, "stop"))) + b"data: [DONE]\n\n"
    finished, seen = await run_once(fake, Reply(body=body, content_type="Text/Event-Stream"))
    assert finished["status"] == "completed"  # media types are case-insensitive
    assert [e["delta"] for e in seen if e["type"] == "message.delta"] == ["fine"]
