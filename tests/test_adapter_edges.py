"""Bad input at the adapters' edges (AI SDK over HTTP and WebSocket, AG-UI) over a real
server: each gets a clear error of its own, never exception text, and leaves the
document free for the next run, which a WebSocket client of the document watches."""

import asyncio
import logging
from typing import Any

import httpx
import orjson
import pytest

from server.adapters import agui, ai_sdk, ai_sdk_ws
from tests.adapter_support import sse, user_message
from tests.harness import Server, joined, running_server, token, ws_client
from tests.runs import REPLACE_DOC, call, script

LEAKS = ("Traceback", "ValidationError", "validation error for", "pydantic", "Exception")


def _auth(sub: str = "alice", **claims: Any) -> dict[str, str]:
    return {"Authorization": f"Bearer {token(sub, **claims)}"}


def _clean(text: str) -> bool:
    return not any(leak in text for leak in LEAKS)


def _agui_input(thread: str = "t1", run: str = "r1", text: str = "hi") -> dict[str, Any]:
    return {"threadId": thread, "runId": run, "state": None, "tools": [], "context": [],
            "forwardedProps": {}, "messages": [{"id": "m1", "role": "user", "content": text}]}


async def _post(http: httpx.AsyncClient, url: str, content: bytes,
                headers: dict[str, str] | None = None) -> httpx.Response:
    return await http.post(url, content=content, timeout=15,
                           headers=_auth() if headers is None else headers)


async def _bad_bodies(http: httpx.AsyncClient, url: str, limit: int) -> list[httpx.Response]:
    """Malformed, not an object, too large (declared and chunked), nested too deep, and
    an integer JSON cannot carry to every client: each a 400 or 413 with its reason."""
    deep = b'{"messages":' + b"[" * 200 + b"]" * 200 + b"}"

    async def chunked() -> Any:
        for _ in range(limit // 65536 + 2):
            yield b" " * 65536

    answers = [
        await _post(http, url, b"{not json"),
        await _post(http, url, b"[1, 2]"),
        await _post(http, url, b'{"x": "' + b"y" * limit + b'"}'),
        await http.post(url, content=chunked(), headers=_auth(), timeout=15),
        await _post(http, url, deep),
        await _post(http, url, b'{"id": 123456789012345678901234567890}'),
    ]
    assert [a.status_code for a in answers] == [400, 400, 413, 413, 400, 400]
    assert [a.json()["code"] for a in answers] == ["invalid_message"] * 2 + ["too_large"] * 2 \
        + ["invalid_message"] * 2
    assert answers[0].json()["message"].startswith("body is not valid JSON: ")
    assert answers[1].json()["message"] == "body must be a JSON object"
    assert answers[4].json()["details"][0]["max_depth"] == 64
    assert "64-bit" in answers[5].json()["message"]
    return answers


async def _unauthorized(http: httpx.AsyncClient, url: str, body: dict[str, Any]
                        ) -> list[httpx.Response]:
    content = orjson.dumps(body)
    answers = [
        await _post(http, url, content, headers={}),
        await _post(http, url, content, headers={"Authorization": "Bearer not-a-jwt"}),
        await _post(http, url, content, headers=_auth(docs=["another-doc"])),
        await _post(http, url, content, headers=_auth(role="viewer")),
    ]
    assert [a.status_code for a in answers] == [401, 401, 403, 403]
    assert [a.json()["code"] for a in answers] == ["invalid_token"] * 2 + ["forbidden"] * 2
    assert answers[0].headers["www-authenticate"] == 'Bearer realm="cowrite"'
    assert answers[3].json()["message"] == "viewers may not run or answer the agent"
    return answers


async def test_ai_sdk_chat_refuses_bad_input_and_the_document_stays_free(server: Server
                                                                          ) -> None:
    url = f"{server.http}/v1/ai-sdk/edge-ai/chat"
    good = {"id": "chat-1", "messages": [user_message(script({"say": "Fine."}))]}
    async with joined(server, "edge-ai", sub="bob", client_id="watcher") as (watcher, _), \
            httpx.AsyncClient() as http:
        answers = await _bad_bodies(http, url, server.settings.max_message_bytes)
        answers += await _unauthorized(http, url, good)
        wrong = [
            await _post(http, url, orjson.dumps({"id": "chat 1", "messages": good["messages"]})),
            await _post(http, url, orjson.dumps({"id": "c", "messages": []})),
            await _post(http, url, orjson.dumps({"id": "c", "messages": [
                {"id": "u", "role": "user", "parts": [{"type": "text"}]}]})),
            # out of order: an answer to a tool call the chat never made
            await _post(http, url, orjson.dumps({"id": "c", "messages": [
                {"id": "a", "role": "assistant", "parts": [
                    {"type": "tool-read_document", "toolCallId": "call_x",
                     "state": "output-available", "input": {}, "output": "x"}]}]})),
        ]
        assert [a.status_code for a in wrong] == [400, 400, 400, 409]
        assert wrong[0].json()["details"][0]["loc"] == ["id"]
        assert wrong[3].json()["code"] == "call_not_pending"
        answers += wrong
        assert all(_clean(a.text) for a in answers)
        nothing = await http.get(f"{url}/no-such-chat/stream", headers=_auth())
        assert nothing.status_code == 204

        status, chunks = await sse(http, "POST", url, good)
        assert status == 200 and chunks[-2:] == [{"type": "finish", "finishReason": "stop"},
                                                 "[DONE]"]
        await watcher.recv_until("run.finished")
    assert [e["type"] for e in watcher.events].count("run.started") == 1


async def test_ai_sdk_answers_of_the_wrong_shape_leave_the_approval_pending(server: Server
                                                                           ) -> None:
    prompt = script({"tool_calls": [call("replace_document", text="New")]}, {"say": "Ok."})
    url = f"{server.http}/v1/ai-sdk/edge-approve/chat"
    user = user_message(prompt)
    async with joined(server, "edge-approve", client_id="tab") as (tab, _), \
            httpx.AsyncClient() as http:
        _, chunks = await sse(http, "POST", url, {"id": "c", "messages": [user],
                                                  "tools": [REPLACE_DOC]})
        request = next(c for c in chunks if c != "[DONE]" and c["type"] == "tool-approval-request")

        def answer(**part: Any) -> bytes:
            return orjson.dumps({"id": "c", "messages": [user, {
                "id": "a", "role": "assistant", "parts": [{
                    "type": "tool-replace_document", "toolCallId": request["toolCallId"],
                    "state": "approval-responded", "input": {"text": "New"}, **part}]}]})

        wrong = [
            await _post(http, url, answer(toolCallId={"not": "a string"})),  # was a 500
            await _post(http, url, answer(toolCallId=[request["toolCallId"]])),
            # a string "false" approved the call before: now nothing but a boolean answers
            await _post(http, url, answer(approval={"id": request["approvalId"],
                                                    "approved": "false"})),
        ]
        assert [a.status_code for a in wrong] == [409, 409, 400]
        assert wrong[2].json()["details"] == [{"loc": ["approval", "approved"],
                                               "msg": "must be a boolean"}]
        assert all(_clean(a.text) for a in wrong)
        status, after = await sse(http, "POST", url, orjson.loads(answer(
            approval={"id": request["approvalId"], "approved": False, "reason": "no"})))
        assert status == 200
        assert [c["type"] for c in after[:-1]][:4] == [
            "start", "tool-approval-response", "start-step", "tool-output-denied"]
        resolved = await tab.recv_until("approval.resolved")
        assert resolved["decision"] == "reject"
        assert [e["type"] for e in tab.events].count("approval.resolved") == 1
        await tab.recv_until("run.finished")


async def test_agui_refuses_bad_input_and_the_document_stays_free(server: Server) -> None:
    url = f"{server.http}/v1/agui/edge-agui"
    async with joined(server, "edge-agui", sub="bob", client_id="watcher") as (watcher, _), \
            httpx.AsyncClient() as http:
        answers = await _bad_bodies(http, url, server.settings.max_message_bytes)
        answers += await _unauthorized(http, url, _agui_input())
        no_prompt = {**_agui_input(run="r2"), "messages": [
            {"id": "m", "role": "tool", "content": "x", "toolCallId": "call_never_made"}]}
        wrong = [
            await _post(http, url, orjson.dumps({"threadId": "t1"})),
            # a threadId too long to name the run's executor was a 500 before
            await _post(http, url, orjson.dumps(_agui_input(thread="t" * 101))),
            await _post(http, url, orjson.dumps(_agui_input(thread=""))),
            await _post(http, url, orjson.dumps(_agui_input(run="r" * 129))),
            await _post(http, url, orjson.dumps(no_prompt)),  # out of order
        ]
        assert [a.status_code for a in wrong] == [400] * 4 + [409]
        assert {d["loc"][0] for d in wrong[0].json()["details"]} == {"runId", "messages"}
        assert wrong[1].json()["details"] == [
            {"loc": ["threadId"], "msg": "threadId must be 1 to 100 characters"}]
        assert wrong[2].json()["details"][0]["loc"] == ["threadId"]
        assert wrong[3].json()["details"][0]["loc"] == ["run_id"]
        assert wrong[4].json()["code"] == "call_not_pending"
        answers += wrong
        assert all(_clean(a.text) for a in answers)

        longest = "t" * agui.THREAD_ID_MAX
        status, events = await sse(http, "POST", url, _agui_input(thread=longest, run="ok-1",
                                                                   text=script({"say": "Hi."})))
        assert status == 200 and events[-1]["type"] == "RUN_FINISHED"
        started = await watcher.recv_until("run.started")
        assert started["client_id"] == f"agui:{longest}" and started["run_id"] == "ok-1"
        await watcher.recv_until("run.finished")
        again = await _post(http, url, orjson.dumps(_agui_input(run="ok-1")))
        assert again.status_code == 400 and "already exists" in again.json()["message"]
    assert [e["type"] for e in watcher.events].count("run.started") == 1


async def test_an_unexpected_failure_is_a_json_500_with_a_ref(
        server: Server, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(_data: dict[str, Any]) -> Any:
        raise RuntimeError("secret detail of a bug")

    monkeypatch.setattr(agui, "_parse", broken)
    url = f"{server.http}/v1/agui/edge-500"
    with caplog.at_level(logging.ERROR, "cowrite.http"):
        async with httpx.AsyncClient() as http:
            answer = await _post(http, url, orjson.dumps(_agui_input()),
                                 {**_auth(), "origin": "http://localhost:3000"})
    assert answer.status_code == 500
    # readable by a page on another origin (it read "Failed to fetch", a disconnect)
    assert answer.headers["access-control-allow-origin"] == "*"
    body = answer.json()
    assert body["code"] == "internal" and body["message"].startswith("internal error (ref ")
    assert "secret" not in answer.text
    ref = body["message"].removeprefix("internal error (ref ").rstrip(")")
    assert any(ref in record.getMessage() for record in caplog.records)


class _Transport:
    """The AI SDK's `WebSocketChatTransport` frames over a `websockets` client."""

    def __init__(self, client: Any) -> None:
        self.ws = client.ws

    async def send_raw(self, text: str) -> None:
        await self.ws.send(text)

    async def send(self, frame: dict[str, Any]) -> None:
        await self.ws.send(orjson.dumps(frame).decode())

    async def next_for(self, request_id: str, kinds: tuple[str, ...]) -> dict[str, Any]:
        while True:
            frame: dict[str, Any] = orjson.loads(await asyncio.wait_for(self.ws.recv(), 10))
            if frame.get("requestId") == request_id and frame["type"] in kinds:
                return frame


def _send_frame(request_id: str, prompt: str, **extra: Any) -> dict[str, Any]:
    return {"type": "send", "requestId": request_id, "id": "ws-chat",
            "messages": [user_message(prompt)], "trigger": "submit-message", **extra}


async def test_ai_sdk_websocket_answers_bad_frames_and_keeps_serving(
        server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    base = f"ws://127.0.0.1:{server.settings.port}/v1/ai-sdk/edge-ws/ws"
    limit = server.settings.max_message_bytes
    async with ws_client(f"{base}?token={token('alice')}") as client:
        socket = _Transport(client)
        # No request to answer: dropped, and the socket stays open.
        for raw in ("{oops", "[]", '{"type": "send"}', "x" * (limit + 1),
                    "[" * 300 + "]" * 300):
            await socket.send_raw(raw)
        await socket.send({"type": "dance", "requestId": "q1"})
        unknown = await socket.next_for("q1", ("error",))
        assert unknown["errorText"] == "unknown frame type 'dance'"
        await socket.send({**_send_frame("q2", "hi"), "id": "bad id"})
        invalid = await socket.next_for("q2", ("error",))
        assert invalid["errorText"].startswith("invalid_message: ")
        await socket.send({"type": "resume", "requestId": "q3", "id": "ws-chat"})
        assert (await socket.next_for("q3", ("no-active", "error")))["type"] == "no-active"

        def broken(_data: dict[str, Any]) -> Any:
            raise RuntimeError("secret detail of a bug")

        with monkeypatch.context() as patch:
            patch.setattr(ai_sdk_ws, "parse_request", broken)
            await socket.send(_send_frame("q4", "hi"))
            failed = await socket.next_for("q4", ("error", "end"))
        assert failed["errorText"].startswith("internal: internal error (ref ")
        assert "secret" not in failed["errorText"]

        await socket.send(_send_frame("q5", script({"say": "Fine."})))
        assert (await socket.next_for("q5", ("start", "error")))["type"] == "start"
        assert (await socket.next_for("q5", ("end", "error")))["type"] == "end"
    async with ws_client(base) as client:  # no token anywhere
        socket = _Transport(client)
        await socket.send(_send_frame("q6", "hi"))
        refused = await socket.next_for("q6", ("error",))
        assert refused["errorText"] == "invalid_token: missing token"
        await socket.send({**_send_frame("q7", "hi"),
                           "headers": {"authorization": f"Bearer {token(role='viewer')}"}})
        viewer = await socket.next_for("q7", ("error",))
        assert viewer["errorText"] == "forbidden: viewers may not run or answer the agent"


async def test_ai_sdk_websocket_bounds_requests_in_flight(server: Server) -> None:
    url = f"ws://127.0.0.1:{server.settings.port}/v1/ai-sdk/edge-ws2/ws?token={token('alice')}"
    slow = script({"say": "x" * 200}, chunk_chars=1, delay_ms=50)
    async with ws_client(url) as client, joined(server, "edge-ws2", client_id="w") as (tab, _):
        socket = _Transport(client)
        await socket.send(_send_frame("s0", slow))
        await socket.next_for("s0", ("start",))
        for index in range(1, ai_sdk_ws.MAX_IN_FLIGHT):  # followers of the same stream
            await socket.send({"type": "resume", "requestId": f"s{index}", "id": "ws-chat"})
        for index in range(1, ai_sdk_ws.MAX_IN_FLIGHT):
            await socket.next_for(f"s{index}", ("start",))
        over = f"s{ai_sdk_ws.MAX_IN_FLIGHT}"
        await socket.send({"type": "resume", "requestId": over, "id": "ws-chat"})
        refused = await socket.next_for(over, ("error", "start"))
        assert refused["errorText"] == (f"rate_limited: at most {ai_sdk_ws.MAX_IN_FLIGHT} "
                                        "requests in flight on one socket")
        await socket.send({"type": "resume", "requestId": "s1", "id": "ws-chat"})
        twice = await socket.next_for("s1", ("error",))
        assert twice["errorText"] == "invalid_message: this requestId is still streaming"
        await socket.send({"type": "abort", "requestId": "s0"})  # cancels the run
        finished = await tab.recv_until("run.finished")
        assert (finished["status"], finished["reason"]) == ("cancelled", "user_cancelled")
        for index in range(1, ai_sdk_ws.MAX_IN_FLIGHT):  # the followers end with it
            await socket.next_for(f"s{index}", ("end",))
        await socket.send({"type": "resume", "requestId": "after", "id": "ws-chat"})
        assert (await socket.next_for("after", ("no-active", "error")))["type"] == "no-active"


async def test_ai_sdk_websocket_answers_frames_refused_by_the_json_limits(server: Server
                                                                         ) -> None:
    """A `send` nested too deep or holding an integer beyond 64 bits (a tool output of
    `JSON.stringify(1e19)`) was dropped as if it named no request: the transport's
    request waited for ever. It gets `error` for its `requestId`, like the core socket."""
    url = f"ws://127.0.0.1:{server.settings.port}/v1/ai-sdk/edge-ws3/ws?token={token('alice')}"
    nested: Any = []
    for _ in range(70):
        nested = [nested]
    async with ws_client(url) as client:
        socket = _Transport(client)
        await socket.send(_send_frame("deep", "hi", metadata=nested))
        await socket.send_raw(orjson.dumps(_send_frame("big", "hi")).decode().replace(
            '"trigger"', '"output":10000000000000000000,"trigger"'))
        # beyond orjson's own depth limit nothing can be read: dropped, as before
        await socket.send_raw('{"requestId": "x", "a": ' + "[" * 1100 + "]" * 1100 + "}")
        deep = await socket.next_for("deep", ("error", "start"))
        assert deep["errorText"] == \
            "invalid_message: frame nests objects and arrays deeper than 64 levels"
        big = await socket.next_for("big", ("error", "start"))
        assert big["errorText"] == \
            "invalid_message: frame holds an integer outside the signed 64-bit range"
        await socket.send({**_send_frame("ok", script({"say": "Fine."})), "id": "other"})
        assert (await socket.next_for("ok", ("start", "error")))["type"] == "start"
        assert (await socket.next_for("ok", ("end", "error")))["type"] == "end"


async def test_ai_sdk_websocket_answers_a_send_over_the_size_limit() -> None:
    """The transport sends the whole chat on every `send`: once it outgrew
    COWRITE_MAX_MESSAGE_BYTES the frame was dropped and the request waited for ever
    (the same body over HTTP is a 413 `too_large`)."""
    async with running_server(max_message_bytes=4096) as server:
        url = f"ws://127.0.0.1:{server.settings.port}/v1/ai-sdk/edge-ws4/ws?token=" \
              f"{token('alice')}"
        async with ws_client(url) as client:
            socket = _Transport(client)
            await socket.send(_send_frame("huge", "x" * 5000))
            huge = await socket.next_for("huge", ("error", "start"))
            assert huge["errorText"] == "too_large: frame larger than 4096 bytes"
            await socket.send({**_send_frame("ok", script({"say": "Fine."})), "id": "other"})
            assert (await socket.next_for("ok", ("start", "error")))["type"] == "start"
            assert (await socket.next_for("ok", ("end", "error")))["type"] == "end"


def test_the_adapters_client_ids_are_the_ones_counted_present_between_requests() -> None:
    """`DocumentSession.has_client` counts an adapter's frontend present by its client id
    prefix (`<kind>:<chat>`): a new adapter kind must be listed there too."""
    from server.session import PER_REQUEST_CLIENTS

    assert PER_REQUEST_CLIENTS == (f"{ai_sdk.KIND}:", f"{agui.KIND}:")
