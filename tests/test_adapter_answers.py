"""Answers that come late, twice, of the wrong shape or from another user of the same
chat id, and aborts that come while a run is starting, through the adapters of a real
server: none of them starts, keeps or takes over a run it should not."""

import asyncio
import random
from pathlib import Path
from typing import Any

import httpx
import orjson

from tests.adapter_support import sse, user_message
from tests.harness import Server, joined, running_server, token, ws_client
from tests.runs import READ, REPLACE_DOC, call, script

TOOLS = [{"name": t["name"], "description": t["description"], "parameters": t["parameters"]}
         for t in (READ, REPLACE_DOC)]


def _agui(run_id: str, messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"threadId": "th", "runId": run_id, "state": None, "tools": TOOLS, "context": [],
            "forwardedProps": {}, "messages": messages, **extra}


def _runs(events: list[dict[str, Any]], kind: str) -> list[str]:
    return [e["run_id"] for e in events if e.get("type") == kind]


async def test_agui_a_late_or_repeated_answer_never_runs_the_prompt_again(server: Server
                                                                          ) -> None:
    url = f"{server.http}/v1/agui/late"
    user = {"id": "m1", "role": "user",
            "content": script({"tool_calls": [call("read_document")]}, {"say": "Read."})}
    async with joined(server, "late", sub="bob", client_id="watcher") as (watcher, _), \
            httpx.AsyncClient() as http:
        _, first = await sse(http, "POST", url, _agui("a1", [user]))
        call_id = next(e["toolCallId"] for e in first if e["type"] == "TOOL_CALL_START")
        result = {"id": "t1", "role": "tool", "toolCallId": call_id, "content": '"text"'}
        answered, again = await asyncio.gather(  # a double submit
            sse(http, "POST", url, _agui("a2", [user, result])),
            sse(http, "POST", url, _agui("a3", [user, result])))
        statuses = sorted([answered[0], again[0]])
        assert statuses == [200, 409]
        refused = again if again[0] == 409 else answered
        assert refused[1][0]["code"] == "call_not_pending"
        await watcher.recv_until("run.finished")
        late = await sse(http, "POST", url, _agui("a4", [user, result]))  # after the run
        assert late[0] == 409 and late[1][0]["code"] == "call_not_pending"
        interrupt = {"interruptId": call_id, "status": "resolved", "payload": None}
        resumed = await sse(http, "POST", url, _agui("a5", [user], resume=[interrupt]))
        assert resumed[0] == 409
    assert len(_runs(watcher.events, "run.started")) == 1  # the prompt ran once
    assert len([e for e in watcher.events if e.get("type") == "tool.done"]) == 1


async def test_agui_an_approval_payload_that_is_not_an_object_approves_nothing(
        tmp_path: Path) -> None:
    config = tmp_path / "cowrite.toml"  # a server tool that needs approval
    config.write_text('[[tools]]\nimport = "tests.tool_fixtures:greet"\n'
                      "requires_approval = true\n")
    user = {"id": "m1", "role": "user",
            "content": script({"tool_calls": [{"name": "greet", "arguments": {"name": "A"}}]},
                              {"say": "Ok."})}
    async with running_server(config=config) as server, \
            joined(server, "payload", sub="bob", client_id="watcher") as (watcher, _), \
            httpx.AsyncClient() as http:
        url = f"{server.http}/v1/agui/payload"
        _, first = await sse(http, "POST", url, _agui("p1", [user]))
        assert first[-1]["outcome"]["type"] == "interrupt"
        call_id = first[-1]["outcome"]["interrupts"][0]["id"]
        for index, payload in enumerate([False, "reject", 0, [], {"approved": "false"}]):
            entry = {"interruptId": call_id, "status": "resolved", "payload": payload}
            status, body = await sse(http, "POST", url, _agui(f"q{index}", [user],
                                                              resume=[entry]))
            assert status == 400 and body[0]["details"][0]["loc"] == ["resume", 0, "payload"]
        assert not [e for e in watcher.events if e.get("type") == "approval.resolved"]
        entry = {"interruptId": call_id, "status": "resolved", "payload": {"approved": False}}
        status, rest = await sse(http, "POST", url, _agui("p2", [user], resume=[entry]))
        assert status == 200 and rest[-1]["type"] == "RUN_FINISHED"
        # the rejected call was never started (no TOOL_CALL_START): no result for it,
        # which left a tool message naming no call in the agent's messages
        assert [e["type"] for e in rest if e["type"].startswith("TOOL_CALL")] == []
        resolved = await watcher.recv_until("approval.resolved")
        assert resolved["decision"] == "reject"
        done = await watcher.recv_until("tool.done")
        assert done["status"] == "rejected"


async def test_ai_sdk_a_server_tool_behind_an_approval_stays_one_part(tmp_path: Path) -> None:
    """Its approval request showed a static part; after the approval the call's chunks
    said `dynamic`, and the SDK added a second part, left `input-available` for ever."""
    config = tmp_path / "cowrite.toml"
    config.write_text('[[tools]]\nimport = "tests.tool_fixtures:greet"\n'
                      "requires_approval = true\n")
    prompt = script({"tool_calls": [{"name": "greet", "arguments": {"name": "A"}}]},
                    {"say": "Greeted."})
    async with running_server(config=config) as server, httpx.AsyncClient() as http:
        url = f"{server.http}/v1/ai-sdk/one-part/chat"
        _, first = await sse(http, "POST", url, {"id": "c", "messages": [user_message(prompt)]})
        request = next(c for c in first if c != "[DONE]" and c["type"] ==
                       "tool-approval-request")
        assistant = {"id": first[0]["messageId"], "role": "assistant", "parts": [
            {"type": "tool-greet", "toolCallId": request["toolCallId"], "input": {"name": "A"},
             "state": "approval-responded", "approval": {"id": request["approvalId"],
                                                         "approved": True}}]}
        _, rest = await sse(http, "POST", url, {"id": "c", "messages": [
            user_message(prompt), assistant]})
    of_call = [c for c in first + rest if c != "[DONE]"
               and c.get("toolCallId") == request["toolCallId"]]
    assert [c["type"] for c in of_call] == [
        "tool-input-start", "tool-input-delta", "tool-approval-request",
        "tool-input-available", "tool-output-available"]
    assert not any(c.get("dynamic") for c in of_call)  # one static part, start to end
    assert of_call[-1]["providerExecuted"] is True
    assert of_call[-1]["output"]["text"].startswith("hello A")


async def test_another_user_naming_the_same_chat_does_not_take_it_over(server: Server
                                                                       ) -> None:
    url = f"{server.http}/v1/ai-sdk/shared-id/chat"
    alices = user_message(script({"tool_calls": [call("read_document")]}, {"say": "Mine."}))
    async with joined(server, "shared-id", sub="carol", client_id="watcher") as (watcher, _), \
            httpx.AsyncClient() as http:
        _, chunks = await sse(http, "POST", url, {"id": "chat-a", "messages": [alices],
                                                  "tools": [READ]})
        call_id = next(c["toolCallId"] for c in chunks if c != "[DONE]"
                       and c["type"] == "tool-input-available")
        # Bob names Alice's chat (every collaborator sees `ai-sdk:chat-a`) and queues a run.
        bobs = asyncio.create_task(sse(http, "POST", url, {
            "id": "chat-a", "messages": [user_message(script({"say": "Bob's."}))],
            "options": {"if_busy": "enqueue"}}, sub="bob"))
        await watcher.recv_until("run.queued")
        answer = {"id": "a", "role": "assistant", "parts": [
            {"type": "tool-read_document", "toolCallId": call_id,
             "state": "output-available", "input": {}, "output": "text"}]}
        status, rest = await sse(http, "POST", url, {"id": "chat-a",
                                                     "messages": [alices, answer]})
        assert status == 200 and rest[-2] == {"type": "finish", "finishReason": "stop"}
        assert "Mine." == "".join(c["delta"] for c in rest if isinstance(c, dict)
                                  and c["type"] == "text-delta")
        status, bob_chunks = await asyncio.wait_for(bobs, 15)
        assert status == 200 and "Bob's." == "".join(
            c["delta"] for c in bob_chunks if isinstance(c, dict) and c["type"] == "text-delta")
        ends = [await watcher.recv_until("run.finished") for _ in range(2)]
    assert [e["status"] for e in ends] == ["completed", "completed"]
    assert [e["user_id"] for e in watcher.events if e["type"] == "run.started"] == [
        "alice", "bob"]


async def test_an_abort_while_the_run_starts_still_ends_the_run(server: Server) -> None:
    """`abort` right behind `send`, at random small delays: whether it lands before,
    while or after the run starts, the streaming run ends cancelled (one streaming on,
    unobserved, to `completed` is the failure)."""
    rnd = random.Random(7)
    url = f"ws://127.0.0.1:{server.settings.port}/v1/ai-sdk/abort-race/ws?token={token()}"
    slow = script({"say": "x" * 40}, chunk_chars=1, delay_ms=20)
    async with ws_client(url) as client, \
            joined(server, "abort-race", sub="bob", client_id="watcher") as (watcher, _):
        for index in range(16):
            frame = {"type": "send", "requestId": f"r{index}", "id": f"chat-{index}",
                     "messages": [user_message(slow)]}
            await client.ws.send(orjson.dumps(frame).decode())
            await asyncio.sleep(rnd.choice([0, 0, 0.0005, 0.001, 0.002, 0.004]))
            await client.ws.send(orjson.dumps({"type": "abort",
                                               "requestId": f"r{index}"}).decode())
            started = await watcher.recv_until("run.started")
            finished = await watcher.recv_until("run.finished")
            assert finished["run_id"] == started["run_id"]
            assert (finished["status"], finished.get("reason")) == ("cancelled", "user_cancelled")
