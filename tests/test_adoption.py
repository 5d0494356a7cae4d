"""Adopting a chat's run (server/adapters/adoption.py, `ChatRuns.find`): where the run
begins in the document log, and the races of rebuilding it while it goes on."""

import asyncio
import time
from typing import Any

import httpx
import pytest

from protocol.server import Error, RunStarted
from server.adapters import chat
from server.adapters.adoption import run_events
from server.adapters.ai_sdk import _answer_in
from server.adapters.ai_sdk_chunks import AiSdkTranslator
from server.adapters.chat import ChatRun, ChatRuns
from server.backends.base import LoggedEvent
from server.backends.memory import MemoryBackend
from tests.adapter_support import sse, user_message
from tests.harness import Server, joined, running_server, token
from tests.runs import READ, call, script


def _started(run_id: str) -> dict[str, Any]:
    return RunStarted(run_id=run_id, mode="agent", user_id="alice", client_id="ai-sdk:c",
                      prompt="p").to_wire()


async def _changes(backend: MemoryBackend, count: int) -> None:
    for n in range(count):
        await backend.append("d", {"type": "document.changed", "n": n})


async def test_the_runs_start_is_found_beyond_the_first_window() -> None:
    backend = MemoryBackend()
    await backend.append("d", _started("run-a"))
    await _changes(backend, 300)
    await backend.append("d", _started("run-b"))
    await _changes(backend, 300)
    epoch, last, events = await run_events(backend, "d", "run-a", 10_000)
    assert epoch == (await backend.head("d")).epoch and last == 602
    assert [e.seq for e in events] == list(range(1, 603))
    _, _, events = await run_events(backend, "d", "run-b", 10_000)
    assert events[0].seq == 302 and events[0].type == "run.started" and events[-1].seq == 602


async def test_a_start_that_left_the_log_gives_what_the_log_kept() -> None:
    backend = MemoryBackend(log_max_events=100)
    await backend.append("d", _started("run-a"))
    await _changes(backend, 300)
    _, last, events = await run_events(backend, "d", "run-a", 100)
    assert last == 301 and [e.seq for e in events] == list(range(202, 302))
    _, _, none = await run_events(backend, "empty", "run-a", 100)
    assert none == []


# -- adoption against a real server (in process: the second `ChatRuns` stands for the
#    adapter state of another instance; the run itself stays the first one's) ------------
def _tool_input(first: list[Any]) -> dict[str, Any]:
    return next(c for c in first if c != "[DONE]" and c["type"] == "tool-input-available")


def _answer_to(first: list[Any]) -> dict[str, Any]:
    tool = _tool_input(first)
    return {"id": first[0]["messageId"], "role": "assistant", "parts": [
        {"type": "tool-read_document", "toolCallId": tool["toolCallId"],
         "state": "output-available", "input": {}, "output": {"text": "hi"}}]}


async def _waiting_chat(srv: Server, http: httpx.AsyncClient, document_id: str
                        ) -> list[Any]:
    prompt = script({"say": "Reading.", "tool_calls": [call("read_document")]}, {"say": "Ok."})
    status, first = await sse(http, "POST", f"{srv.http}/v1/ai-sdk/{document_id}/chat", {
        "id": "c1", "messages": [user_message(prompt)], "tools": [READ]})
    assert status == 200 and first[-2]["finishReason"] == "tool-calls"
    return first


async def test_an_adoption_sees_the_run_end_that_came_while_it_read_the_log(
        monkeypatch: pytest.MonkeyPatch) -> None:
    async with running_server() as srv, httpx.AsyncClient() as http, \
            joined(srv, "doc-r", client_id="editor") as (editor, _):
        await _waiting_chat(srv, http, "doc-r")
        read = run_events

        async def then_an_edit(*args: Any) -> tuple[str, int, list[LoggedEvent]]:
            found = await read(*args)
            await editor.send({"type": "editor.change", "origin": "user"})  # aborts the run
            await editor.recv_until("run.finished")
            return found

        monkeypatch.setattr(chat, "run_events", then_an_edit)
        other = ChatRuns(srv.services)
        principal = srv.services.auth.verify(token("alice"))
        assert await other.find("ai-sdk", "doc-r", "c1", principal, AiSdkTranslator) is None
        await asyncio.sleep(0.1)  # the finished chat's closer
        assert srv.services.hub._holds == {"doc-r": 1} and other.runs == {}  # the editor's


async def test_an_answer_in_flight_when_the_run_ends_gets_its_refusal_at_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    async with running_server() as srv, httpx.AsyncClient() as http, \
            joined(srv, "doc-s", client_id="editor") as (editor, _):
        first = await _waiting_chat(srv, http, "doc-s")
        other = ChatRuns(srv.services)
        principal = srv.services.auth.verify(token("alice"))
        adopted = await other.find("ai-sdk", "doc-s", "c1", principal, AiSdkTranslator)
        assert isinstance(adopted, ChatRun) and list(adopted.pending) == [
            _tool_input(first)["toolCallId"]]
        message = _answer_in(adopted, _answer_to(first))
        assert message is not None
        handle = adopted.link.session.handle

        async def after_an_edit(conn: Any, sent: Any) -> None:
            if conn is adopted.link.conn:
                # The run ends while the answer travels (a non-owner's cluster round trip).
                await editor.send({"type": "editor.change", "origin": "user"})
                await editor.recv_until("run.finished")
                await asyncio.sleep(0.05)
            await handle(conn, sent)

        monkeypatch.setattr(adopted.link.session, "handle", after_an_edit)
        began = time.monotonic()
        answer = await adopted.answer(message)
        assert isinstance(answer, Error) and answer.code == "run_not_active"
        assert time.monotonic() - began < 5  # not the link's 10 s reply timeout
        await other.close()


async def test_a_log_that_cannot_resume_is_a_retry_not_a_half_adopted_chat(
        monkeypatch: pytest.MonkeyPatch) -> None:
    async with running_server() as srv, httpx.AsyncClient() as http:
        await _waiting_chat(srv, http, "doc-t")
        holds = dict(srv.services.hub._holds)
        read = run_events

        async def another_epoch(*args: Any) -> tuple[str, int, list[LoggedEvent]]:
            _, last_seq, events = await read(*args)
            return "an-epoch-the-log-no-longer-has", last_seq, events

        monkeypatch.setattr(chat, "run_events", another_epoch)
        srv.app.state.chat_runs = other = ChatRuns(srv.services)  # as another instance
        url = f"{srv.http}/v1/ai-sdk/doc-t/chat/c1/stream"
        failed = await http.get(url, headers={"Authorization": f"Bearer {token('alice')}"})
        assert failed.status_code == 503 and failed.json()["code"] == "unavailable"
        assert other.runs == {} and srv.services.hub._holds == holds
        monkeypatch.setattr(chat, "run_events", run_events)
        status, replayed = await sse(http, "GET", url)  # the retry adopts it
        assert status == 200 and replayed[-2]["finishReason"] == "tool-calls"


async def test_agui_another_users_prompt_is_answered_alike_on_either_instance() -> None:
    prompt = script({"say": "Reading.", "tool_calls": [call("read_document")]})
    base = {"threadId": "t1", "state": {}, "context": [], "forwardedProps": {}, "tools": [
        {"name": "read_document", "description": "Read.", "parameters": READ["parameters"]}]}
    async with running_server() as srv, httpx.AsyncClient() as http:
        url = f"{srv.http}/v1/agui/doc-u"
        status, events = await sse(http, "POST", url, {
            **base, "runId": "alices", "messages": [{"id": "m1", "role": "user",
                                                      "content": prompt}]})
        assert status == 200 and events[-1]["type"] == "RUN_FINISHED"
        history = [{"id": "m0", "role": "tool", "toolCallId": "an-old-call", "content": "{}"},
                   {"id": "m9", "role": "user", "content": "Bob's question"}]
        here = await sse(http, "POST", url, {**base, "runId": "bobs", "messages": history},
                         sub="bob")
        srv.app.state.chat_runs = ChatRuns(srv.services)  # as another instance
        there = await sse(http, "POST", url, {**base, "runId": "bobs2", "messages": history},
                          sub="bob")
        assert here == there  # not 403 where the run was not started: his own prompt
        assert here[0] == 409 and here[1][0]["code"] == "document_busy"
