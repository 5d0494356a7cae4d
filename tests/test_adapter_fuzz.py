"""Random answers to a waiting run, through the AI SDK and AG-UI endpoints of a real
server (a seeded generator, so a failure replays): every answer gets a 200 or a 4xx
error of its own, never a 5xx or exception text, and the chat goes on answering.
This is how two 500s and an approval given by the string "false" were found."""

import random
from typing import Any

import httpx
import orjson

from tests.adapter_support import sse, user_message
from tests.harness import Server, joined, token
from tests.runs import READ, REPLACE_DOC, call, script

ROUNDS = 60
LEAKS = ("Traceback", "ValidationError", "validation error for", "Exception")
ATOMS: list[Any] = [None, True, False, 0, -1, 2**62, 1.5, "", "x", "output-available",
                    "output-error", "approval-responded", "resolved", "cancelled", [], {}]


def _value(rnd: random.Random, depth: int = 0) -> Any:
    roll = rnd.random()
    if depth > 3 or roll < 0.5:
        return rnd.choice(ATOMS)
    if roll < 0.7:
        return [_value(rnd, depth + 1) for _ in range(rnd.randint(0, 3))]
    keys = ["id", "type", "state", "toolCallId", "output", "approval", "approved", "text"]
    return {rnd.choice(keys): _value(rnd, depth + 1) for _ in range(rnd.randint(0, 3))}


def _ai_sdk_part(rnd: random.Random, call_id: str) -> Any:
    roll = rnd.random()
    if roll < 0.1:
        return _value(rnd)
    if roll < 0.25:  # a real answer (if it fits what the call waits for)
        return rnd.choice([
            {"type": "tool-read_document", "toolCallId": call_id, "state": "output-available",
             "input": {}, "output": _value(rnd)},
            {"type": "tool-replace_document", "toolCallId": call_id,
             "state": "approval-responded", "input": {"text": "N"},
             "approval": {"id": call_id, "approved": rnd.choice([True, False])}}])
    part: dict[str, Any] = {
        "type": rnd.choice(["tool-read_document", "tool-replace_document", "dynamic-tool"]),
        "toolCallId": rnd.choice([call_id, call_id, _value(rnd)])}
    for _ in range(rnd.randint(0, 4)):
        key = rnd.choice(["state", "state", "input", "output", "errorText", "approval"])
        part[key] = rnd.choice([_value(rnd), "output-available", "approval-responded",
                                {"id": call_id, "approved": _value(rnd)}])
    return part


def _agui_answer(rnd: random.Random, call_id: str) -> dict[str, Any]:
    if rnd.random() < 0.5:
        message: dict[str, Any] = {
            "id": "t", "role": "tool", "toolCallId": rnd.choice([call_id, call_id, "other"]),
            "content": rnd.choice(["x", '{"a": 1}', "[1", orjson.dumps(_value(rnd)).decode()])}
        if rnd.random() < 0.3:
            message["error"] = rnd.choice(["boom", "", _value(rnd)])
        return {"messages": [message]}
    return {"messages": [], "resume": [
        {"interruptId": rnd.choice([call_id, "other", _value(rnd)]),
         "status": rnd.choice(["resolved", "cancelled", _value(rnd)]), "payload": _value(rnd)}
        for _ in range(rnd.randint(0, 2))]}


def _assert_answered(status: int, items: list[Any]) -> None:
    assert status in (200, 400, 403, 409), (status, items)
    assert not any(leak in orjson.dumps(items).decode() for leak in LEAKS), items


def _waiting(items: list[Any], kinds: tuple[str, ...]) -> str | None:
    """The call id a response left waiting on the frontend, if any: the last call it
    announced, unless the response ended the run."""
    dicts = [item for item in items if isinstance(item, dict)]
    if any(d.get("type") in ("abort", "error", "RUN_ERROR") or d.get("finishReason") == "stop"
           for d in dicts):
        return None
    calls = [str(d["toolCallId"]) for d in dicts if d.get("type") in kinds]
    return calls[-1] if calls else None


AI_SDK_WAITS = ("tool-input-available", "tool-approval-request")
AGUI_WAITS = ("TOOL_CALL_START",)


async def test_random_ai_sdk_answers_never_break_the_chat(server: Server) -> None:
    rnd = random.Random(20261127)
    url = f"{server.http}/v1/ai-sdk/fuzz-ai/chat"
    prompt = script({"tool_calls": [call("replace_document", text="N")]},
                    {"tool_calls": [call("read_document")]}, {"say": "end"})
    user = user_message(prompt)
    body = {"id": "c", "messages": [user], "tools": [READ, REPLACE_DOC]}
    async with httpx.AsyncClient() as http, \
            joined(server, "fuzz-ai", sub="bob", client_id="watcher") as (watcher, _):
        _, items = await sse(http, "POST", url, body)
        call_id = _waiting(items, AI_SDK_WAITS)
        moved_on = 0
        for _ in range(ROUNDS):
            if call_id is None:  # the run ended: the next prompt starts another
                _, items = await sse(http, "POST", url, body)
                call_id = _waiting(items, AI_SDK_WAITS)
                assert call_id is not None
            answer = {"id": "a", "role": "assistant", "parts": [_ai_sdk_part(rnd, call_id)]}
            status, items = await sse(http, "POST", url, {"id": "c",
                                                          "messages": [user, answer]})
            _assert_answered(status, items)
            if status == 200:
                moved_on += 1
                call_id = _waiting(items, AI_SDK_WAITS)
        assert moved_on > 0  # some random answers were real answers
        status, items = await sse(http, "POST", url, {"id": "c", "messages": [
            user_message(script({"say": "fresh"}))]})
        assert status == 200 and items[-2] == {"type": "finish", "finishReason": "stop"}
        done = await watcher.recv_until(lambda e: e.get("type") == "message.done"
                                        and e.get("text") == "fresh")
        await watcher.recv_until(lambda e: e.get("type") == "run.finished"
                                 and e["run_id"] == done["run_id"])
    starts = [e["run_id"] for e in watcher.events if e["type"] == "run.started"]
    ends = [e["run_id"] for e in watcher.events if e["type"] == "run.finished"]
    assert sorted(starts) == sorted(ends)  # every run ended, once


async def test_random_agui_answers_never_break_the_thread(server: Server) -> None:
    rnd = random.Random(20261128)
    url = f"{server.http}/v1/agui/fuzz-agui"
    prompt = script({"tool_calls": [call("replace_document", text="N")]},
                    {"tool_calls": [call("read_document")]}, {"say": "end"})
    tools = [{"name": t["name"], "description": t["description"],
              "parameters": t["parameters"]} for t in (READ, REPLACE_DOC)]
    user = {"id": "m1", "role": "user", "content": prompt}
    base: dict[str, Any] = {"threadId": "th", "state": None, "tools": tools, "context": [],
                            "forwardedProps": {}}
    headers = {"Authorization": f"Bearer {token('alice')}"}
    async with httpx.AsyncClient() as http:
        _, items = await sse(http, "POST", url, {**base, "runId": "g0", "messages": [user]})
        call_id, moved_on = _waiting(items, AGUI_WAITS), 0
        for index in range(ROUNDS):
            if call_id is None:
                _, items = await sse(http, "POST", url, {**base, "runId": f"s{index}",
                                                         "messages": [user]})
                call_id = _waiting(items, AGUI_WAITS)
                assert call_id is not None
            answer = _agui_answer(rnd, call_id)
            status, items = await sse(http, "POST", url, {
                **base, "runId": f"g{index + 1}", "messages": [user, *answer["messages"]],
                **({"resume": answer["resume"]} if "resume" in answer else {})})
            _assert_answered(status, items)
            if status == 200:
                moved_on += 1
                call_id = _waiting(items, AGUI_WAITS)
        assert moved_on > 0
        fresh = {**base, "runId": "fresh", "messages": [
            {"id": "m9", "role": "user", "content": script({"say": "fresh"})}]}
        async with http.stream("POST", url, json=fresh, headers=headers) as response:
            assert response.status_code == 200
            lines = [line async for line in response.aiter_lines() if line.startswith("data:")]
        assert orjson.loads(lines[-1][5:])["type"] == "RUN_FINISHED"
