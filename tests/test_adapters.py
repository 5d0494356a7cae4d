"""AI SDK and AG-UI endpoints over a real server, watched by a WebSocket client
of the same document: adapter runs are ordinary runs."""

from typing import Any

import httpx
import orjson

from tests.adapter_support import sse, user_message
from tests.harness import Server, joined, token
from tests.runs import READ, REPLACE_DOC, call, script

AUTH = {"Authorization": f"Bearer {token('alice')}"}


async def test_ai_sdk_client_tool_continues_the_same_run(server: Server) -> None:
    prompt = script({"say": "Reading.", "tool_calls": [call("read_document")]},
                    {"say": "Read it."})
    url = f"{server.http}/v1/ai-sdk/doc-1/chat"
    async with joined(server, sub="bob", client_id="watcher") as (watcher, _), \
            httpx.AsyncClient() as http:
        status, chunks = await sse(http, "POST", url, {
            "id": "chat1", "messages": [user_message(prompt)], "trigger": "submit-message",
            "tools": [READ]})
        assert status == 200 and chunks[-1] == "[DONE]"
        types = [c["type"] for c in chunks[:-1]]
        assert types[:2] == ["start", "start-step"]
        assert types[-3:] == ["tool-input-available", "finish-step", "finish"]
        text = "".join(c["delta"] for c in chunks[:-1] if c["type"] == "text-delta")
        assert text == "Reading."
        tool = chunks[-4]
        assert tool["toolName"] == "read_document" and "token" not in orjson.dumps(chunks).decode()
        started = await watcher.recv_until("run.started")
        assert started["client_id"] == "ai-sdk:chat1"

        assistant = {"id": chunks[0]["messageId"], "role": "assistant", "parts": [
            {"type": "tool-read_document", "toolCallId": tool["toolCallId"],
             "state": "output-available", "input": {}, "output": {"text": "hi"}}]}
        status, rest = await sse(http, "POST", url, {
            "id": "chat1", "messages": [user_message(prompt), assistant], "tools": [READ]})
        assert status == 200
        # the tool's output, then the model's next step: the last step has no tool parts,
        # so a useChat `sendAutomaticallyWhen` does not send again once the run ends
        assert [c["type"] for c in rest[:-1]] == [
            "start", "start-step", "tool-output-available", "text-start",
            *["text-delta"] * (len(rest) - 8), "text-end", "finish-step", "finish"]
        assert rest[-2] == {"type": "finish", "finishReason": "stop"}
        assert "Read it." == "".join(c["delta"] for c in rest if isinstance(c, dict)
                                     and c["type"] == "text-delta")
        finished = await watcher.recv_until("run.finished")
        assert finished["run_id"] == started["run_id"] and finished["status"] == "completed"
        assert len([e for e in watcher.events if e.get("type") == "run.started"]) == 1

        replayed = await http.get(f"{url}/chat1/stream", headers=AUTH)
        assert replayed.status_code == 204
        again = await sse(http, "POST", url, {"id": "chat1",
                                               "messages": [user_message(prompt), assistant]})
        assert again[0] == 409 and again[1][0]["code"] == "call_not_pending"


async def test_ai_sdk_approval_and_edit_abort(server: Server) -> None:
    prompt = script({"tool_calls": [call("replace_document", text="New")]}, {"say": "Ok."})
    url = f"{server.http}/v1/ai-sdk/doc-2/chat"
    async with joined(server, "doc-2", client_id="editor") as (editor, _), \
            httpx.AsyncClient() as http:
        _, chunks = await sse(http, "POST", url, {
            "id": "c2", "messages": [user_message(prompt)], "tools": [REPLACE_DOC]})
        request = next(c for c in chunks if c != "[DONE]" and c["type"] == "tool-approval-request")
        assert not any(c != "[DONE]" and c["type"] == "tool-input-available" for c in chunks)
        assistant = {"id": "a", "role": "assistant", "parts": [
            {"type": "tool-replace_document", "toolCallId": request["toolCallId"],
             "state": "approval-responded", "input": {"text": "New"},
             "approval": {"id": request["approvalId"], "approved": True}}]}
        _, after = await sse(http, "POST", url, {
            "id": "c2", "messages": [user_message(prompt), assistant], "tools": [REPLACE_DOC]})
        kinds = [c["type"] for c in after[:-1]]
        assert kinds == ["start", "tool-approval-response", "tool-input-available", "finish"]
        resolved = await editor.recv_until("approval.resolved")
        assert resolved["user_id"] == "alice"
        # The run now waits on the AI SDK client; a user's edit elsewhere aborts it.
        await editor.send({"type": "editor.change", "origin": "user"})
        finished = await editor.recv_until("run.finished")
        assert (finished["status"], finished["reason"]) == ("aborted", "document_changed")
        gone = await http.get(f"{url}/c2/stream", headers=AUTH)
        assert gone.status_code == 204


async def test_ai_sdk_reconnect_replays_and_cancel_from_websocket(server: Server) -> None:
    slow = script({"say": "x" * 40}, chunk_chars=1, delay_ms=30)
    url = f"{server.http}/v1/ai-sdk/doc-3/chat"
    async with joined(server, "doc-3", client_id="tab") as (tab, _), httpx.AsyncClient() as http:
        async with http.stream("POST", url, headers=AUTH, json={
                "id": "c3", "messages": [user_message(slow)]}, timeout=10) as first:
            assert first.headers["x-vercel-ai-ui-message-stream"] == "v1"
            lines = first.aiter_lines()
            async for line in lines:
                if '"text-delta"' in line:
                    break
            # A second reader (reconnectToStream) gets the whole stream from `start`.
            async with http.stream("GET", f"{url}/c3/stream", headers=AUTH,
                                   timeout=10) as resumed:
                assert resumed.status_code == 200
                seen: list[dict[str, Any]] = []
                async for line in resumed.aiter_lines():
                    if line.startswith("data: {"):
                        seen.append(orjson.loads(line[6:]))
                        if len(seen) == 4:
                            break
                assert [c["type"] for c in seen] == ["start", "start-step", "text-start",
                                                     "text-delta"]
            started = await tab.recv_until("run.started")
            await tab.send({"type": "run.cancel", "run_id": started["run_id"]})
            rest = [line async for line in lines if line.startswith("data: ")]
        assert rest[-1] == "data: [DONE]"
        assert orjson.loads(rest[-2][6:]) == {"type": "abort",
                                              "reason": "cancelled: user_cancelled"}


async def test_ai_sdk_refusals(server: Server) -> None:
    url = f"{server.http}/v1/ai-sdk/doc-4/chat"
    async with httpx.AsyncClient() as http:
        no_auth = await http.post(url, json={"id": "c", "messages": [user_message("hi")]})
        assert no_auth.status_code == 401
        bad = await http.post(url, headers=AUTH, json={"id": "c", "messages": []})
        assert bad.status_code == 400 and bad.json()["code"] == "invalid_message"
        bad_tools = await http.post(url, headers=AUTH, json={
            "id": "c", "messages": [user_message("hi")], "tools": [{"name": "bad name"}]})
        assert bad_tools.status_code == 400


async def test_agui_frontend_tool_and_finish(server: Server) -> None:
    prompt = script({"say": "Reading.", "tool_calls": [call("read_document")]}, {"say": "Fine."})
    url = f"{server.http}/v1/agui/doc-5"
    base = {"threadId": "t1", "state": {"mood": "ok"}, "context": [],
            "tools": [{"name": "read_document", "description": "Read.",
                       "parameters": READ["parameters"]}], "forwardedProps": {}}
    user = {"id": "m1", "role": "user", "content": prompt}
    async with joined(server, "doc-5", client_id="w") as (watcher, _), \
            httpx.AsyncClient() as http:
        _, events = await sse(http, "POST", url, {**base, "runId": "agui-run-1",
                                                   "messages": [user]})
        kinds = [e["type"] for e in events]
        assert kinds[0] == "RUN_STARTED" and kinds[-1] == "RUN_FINISHED"
        assert kinds[-4:-1] == ["TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END"]
        call_id = events[-2]["toolCallId"]
        assert events[-1]["outcome"] == {"type": "success", "pendingToolCallIds": [call_id]}
        started = await watcher.recv_until("run.started")
        assert started["run_id"] == "agui-run-1"

        messages = [user, {"id": "m2", "role": "assistant", "toolCalls": [
            {"id": call_id, "type": "function",
             "function": {"name": "read_document", "arguments": "{}"}}]},
            {"id": "m3", "role": "tool", "toolCallId": call_id, "content": '{"text": "doc"}'}]
        _, rest = await sse(http, "POST", url, {**base, "runId": "agui-run-2",
                                                 "messages": messages})
        assert [e["type"] for e in rest] == [
            "RUN_STARTED", "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_CONTENT",
            "TEXT_MESSAGE_END", "RUN_FINISHED"]
        assert rest[0]["runId"] == "agui-run-2" and rest[-1]["runId"] == "agui-run-2"
        done = await watcher.recv_until("tool.done")
        assert done["output"] == {"text": "doc"}
        assert (await watcher.recv_until("run.finished"))["run_id"] == "agui-run-1"


async def test_ai_sdk_resume_does_not_ask_for_an_answered_client_tool_again(
        server: Server) -> None:
    """A resume replays the run from its start, and the SDK calls `onToolCall` for every
    `tool-input-available` it reads: the frontend ran an answered tool a second time
    (a tool that inserts text inserted it twice). The replay rebuilds that part from its
    input chunks and its output instead."""
    prompt = script({"say": "Reading.", "tool_calls": [call("read_document")]},
                    {"say": "x" * 30}, chunk_chars=1, delay_ms=40)
    url = f"{server.http}/v1/ai-sdk/doc-r/chat"
    async with httpx.AsyncClient() as http:
        _, chunks = await sse(http, "POST", url, {
            "id": "cr", "messages": [user_message(prompt)], "tools": [READ]})
        asked = next(c for c in chunks if c != "[DONE]" and c["type"] == "tool-input-available")
        assistant = {"id": chunks[0]["messageId"], "role": "assistant", "parts": [
            {"type": "tool-read_document", "toolCallId": asked["toolCallId"],
             "state": "output-available", "input": {}, "output": {"text": "hi"}}]}
        async with http.stream("POST", url, headers=AUTH, timeout=15, json={
                "id": "cr", "messages": [user_message(prompt), assistant], "tools": [READ]}
                ) as answering:
            lines = answering.aiter_lines()
            while "text-delta" not in await anext(lines):  # the next step streams...
                pass
            status, replayed = await sse(http, "GET", f"{url}/cr/stream")  # ...the tab resumes
        assert status == 200
        of_call = [c["type"] for c in replayed if c != "[DONE]"
                   and c.get("toolCallId") == asked["toolCallId"]]
        assert of_call == ["tool-input-start", "tool-input-delta", "tool-output-available"]
        assert "".join(c["delta"] for c in replayed if c != "[DONE]"
                       and c["type"] == "text-delta") == "Reading." + "x" * 30
