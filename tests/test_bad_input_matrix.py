"""The cells of the bad-input matrix the other test files left empty: each input path (the
document WebSocket, HTTP tool results, the AI SDK and AG-UI adapters, the model's stream,
server and MCP tool outputs, the config file) against malformed, oversized, deeply nested,
unauthorized and out-of-order input, over real servers and clients.

What is asserted is what a user notices: the error code and message the client gets, that
the document is free afterwards (a new run starts and completes), and that no exception
text (a traceback, an exception's class name, a file path) reaches the client. The cells
already covered elsewhere are listed in each section's comment. Eight of these cases showed
bugs when the file was written (lone surrogates from the model, tool arguments and AG-UI tool
content nested too deep, an MCP server's own -32000 error, a TOML file nested too deeply);
they are fixed.
"""

import asyncio
import os
import re
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from server.tools import ToolError
from server.tools.catalog import ToolCatalog
from tests.adapter_support import sse, user_message
from tests.fake_openai import FakeOpenAI, Reply, chunk, running_fake_openai
from tests.harness import Client, Server, joined, running_server, token
from tests.runs import READ, answer, call, of_run, script, start
from tests.tool_support import until

ROOT = Path(__file__).resolve().parents[1]
LEAK = re.compile(r"Traceback|File \"|\.py\b|site-packages|\b[A-Z]\w*(?:Error|Exception)\b")
WITH_TOOL = script({"tool_calls": [call("read_document")]}, {"say": "done"})
NEEDS_APPROVAL = script({"tool_calls": [call("replace_document", text="x")]}, {"say": "done"})
OBJECT_TOOL = {"name": "note", "description": "Take a note.", "parameters": {"type": "object"}}


def assert_clean(what: Any) -> None:
    """No exception text in what a client was sent."""
    text = what if isinstance(what, str) else orjson.dumps(what).decode()
    assert not LEAK.search(text), text[:2000]


def finished_of(run_id: str) -> Callable[[dict[str, Any]], bool]:
    return lambda e: e.get("type") == "run.finished" and e.get("run_id") == run_id


def reply_to(tag: str) -> Callable[[dict[str, Any]], bool]:
    return lambda e: e.get("reply_to") == tag


async def a_new_run_completes(server: Server, document_id: str = "doc-1",
                              fake: FakeOpenAI | None = None) -> None:
    """The document is free: another user starts a run on it and sees it complete."""
    if fake is not None:
        fake.replies = [Reply(text=["fine"])]
    async with joined(server, document_id, sub="zoe", client_id="zoe-tab") as (zoe, _):
        prompt = "hello" if fake is not None else script({"say": "fine"})
        ack = await start(zoe, prompt, mode="chat")
        finished = await zoe.recv_until(finished_of(ack["run_id"]))
        assert finished["status"] == "completed", finished


def nested(depth: int) -> str:
    """JSON text of `depth` levels of objects."""
    return '{"a":' * depth + '"leaf"' + "}" * depth


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with running_fake_openai() as fake_server:
        yield fake_server


def openai_server(fake: FakeOpenAI, **overrides: Any) -> Any:
    return running_server(llm="openai", openai_api_key="sk-test", model="test-model",
                          openai_base_url=fake.base_url, **overrides)


async def model_run(client: Client, fake: FakeOpenAI, *replies: Reply, timeout: float = 5.0,
                    **fields: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One run against `replies`, answering client tool calls; its run.finished and events."""
    fake.replies = list(replies)
    ack = await start(client, "hello", **fields)
    while True:
        event = await client.recv_until(
            lambda e: e.get("run_id") == ack["run_id"]
            and e.get("type") in ("tool.call", "run.finished"), timeout)
        if event["type"] == "run.finished":
            return event, of_run(client.events, ack["run_id"])
        if event.get("executor") == "client":
            await answer(client, event, {"text": "doc"})


def tool_messages(fake: FakeOpenAI) -> list[str]:
    """What the model was told of its tool calls, in every request."""
    return [m["content"] for request in fake.requests for m in request["messages"]
            if m["role"] == "tool"]


# -- (1) the document WebSocket ---------------------------------------------------------------
# Covered elsewhere: malformed (test_transport_messages: bad frames, wrong JSON types, fuzz;
# test_run_robustness fuzz), oversized (too_large then 1009; 64 KiB before hello), deeply
# nested (test_edges_frames, test_run_robustness), unauthorized (test_transport_auth tokens,
# viewers; test_run_endings another user answering or cancelling; test_runs a foreign call
# token), out of order (before hello, hello twice, late / duplicate / not pending results,
# results for a queued run).

async def test_ws_lone_surrogate_escapes_are_invalid_message(server: Server) -> None:
    """JSON may escape half a UTF-16 pair (`\\ud800`); no string can hold it as UTF-8."""
    async with joined(server) as (client, _):
        for tag, text in (("s1", '{"type":"run.start","id":"s1","prompt":"a\\ud800"}'),
                          ("s2", '{"type":"editor.change","id":"s2","summary":"\\udc00"}'),
                          ("s3", '{"type":"ping","id":"s3","\\ud83d":1}')):
            await client.ws.send(text)
            error = await client.recv_until("error")
            assert error["code"] == "invalid_message", (tag, error)
            assert error["message"].startswith("frame is not valid JSON"), error
        assert_clean(client.events)
        assert not [e for e in client.events if e.get("type") in ("run.started",
                                                                   "document.changed")]
    await a_new_run_completes(server)


async def test_ws_answers_of_the_wrong_kind_leave_the_call_waiting(server: Server) -> None:
    """Out of order: a result for a call still waiting for its approval, an approval for a
    call that needs none, a repeated approval; each is `call_not_pending` and the run goes on."""
    async with joined(server) as (client, _):
        ack = await start(client, NEEDS_APPROVAL)
        run_id = ack["run_id"]
        requested = await client.recv_until("approval.requested")
        await client.send({"type": "tool.result", "id": "early", "run_id": run_id,
                           "call_id": requested["call_id"], "token": "t", "output": 1})
        early = await client.recv_until(reply_to("early"))
        assert (early["type"], early["code"]) == ("error", "call_not_pending"), early
        approval = {"type": "approval", "run_id": run_id, "call_id": requested["call_id"],
                    "decision": "approve"}
        await client.send({**approval, "id": "yes"})
        tool_call = await client.recv_until("tool.call")
        for tag in ("again", "for-a-call"):  # the approval is spent; the call needs none
            await client.send({**approval, "id": tag})
            refused = await client.recv_until(reply_to(tag))
            assert (refused["type"], refused["code"]) == ("error", "call_not_pending"), refused
        await answer(client, tool_call, {"ok": True}, id="ok")
        assert (await client.recv_until(reply_to("ok")))["type"] == "ack"
        finished = await client.recv_until(finished_of(run_id))
        assert finished["status"] == "completed"
        assert len(of_run(client.events, run_id, "tool.done")) == 1
        assert_clean(client.events)
    await a_new_run_completes(server)


async def test_ws_a_refresh_to_a_token_for_another_document_keeps_the_old_one(
        server: Server) -> None:
    """Unauthorized: `auth.refresh` with a token that does not grant this document is
    `forbidden`, and the connection keeps its rights (a run still starts)."""
    async with joined(server) as (client, _):
        await client.send({"type": "auth.refresh", "id": "r1", "token": token(docs=["other"])})
        refused = await client.recv_until(reply_to("r1"))
        assert (refused["type"], refused["code"]) == ("error", "forbidden"), refused
        ack = await start(client, script({"say": "still an editor"}))
        assert (await client.recv_until(finished_of(ack["run_id"])))["status"] == "completed"
        assert_clean(client.events)


# -- (2) HTTP tool results ------------------------------------------------------------------
# Covered elsewhere (test_tool_results_http): malformed JSON, both output and error, unknown
# fields, too deep, too large (413), no / foreign / viewer / other-document JWT, wrong call
# token, unknown run, call not pending, finished run, duplicate, rate limit.

async def test_http_tool_result_bytes_that_are_not_utf8_and_a_result_before_its_approval(
        server: Server) -> None:
    async with joined(server) as (client, _), httpx.AsyncClient() as http:
        ack = await start(client, NEEDS_APPROVAL)
        requested = await client.recv_until("approval.requested")
        url = f"{server.http}/v1/documents/doc-1/runs/{ack['run_id']}/tool-results"
        auth = {"Authorization": f"Bearer {token()}"}
        answers = [
            await http.post(url, headers=auth, content=b'{"call_id": "c", "token": "t", '
                                                       b'"output": "caf\xe9"}'),
            await http.post(url, headers=auth, content=b'{"call_id": "c", "token": "t", '
                                                       b'"output": "\\ud800"}'),
            # out of order: the call waits for its approval, not for a result
            await http.post(url, headers=auth, json={"call_id": requested["call_id"],
                                                     "token": "t", "output": 1}),
        ]
        assert [a.status_code for a in answers] == [400, 400, 409], [a.text for a in answers]
        assert [a.json()["code"] for a in answers] == ["invalid_message", "invalid_message",
                                                       "call_not_pending"]
        assert all(a.json()["message"].startswith("body is not valid JSON")
                   for a in answers[:2])
        for answered in answers:
            assert_clean(answered.text)
        await client.send({"type": "approval", "run_id": ack["run_id"],
                           "call_id": requested["call_id"], "decision": "reject"})
        assert (await client.recv_until(finished_of(ack["run_id"])))["status"] == "completed"
    await a_new_run_completes(server)


# -- (3) the AI SDK over HTTP and WebSocket ---------------------------------------------------
# Covered elsewhere (test_adapter_edges, test_adapter_abuse, test_adapter_fuzz): every kind
# on POST .../chat and on the WebSocket transport. The resume GET had no unauthorized or
# malformed case; the model's own output that a frontend must echo back is in section (5).

async def test_ai_sdk_resume_refuses_strangers_and_odd_chat_ids(server: Server) -> None:
    url = f"{server.http}/v1/ai-sdk/resume-doc/chat"
    async with joined(server, "resume-doc", sub="carol", client_id="w") as (watcher, _), \
            httpx.AsyncClient() as http:
        status, chunks = await sse(http, "POST", url, {
            "id": "c1", "messages": [user_message(WITH_TOOL)], "tools": [READ]})
        assert status == 200 and any(isinstance(c, dict) and c["type"] ==
                                     "tool-input-available" for c in chunks)
        stream = f"{url}/c1/stream"

        def bearer(value: str) -> dict[str, str]:
            return {"Authorization": f"Bearer {value}"}

        refused = [
            await http.get(stream),
            await http.get(stream, headers=bearer("not-a-jwt")),
            await http.get(stream, headers=bearer(token(ttl_s=-5))),
            await http.get(stream, headers=bearer(token(docs=["elsewhere"]))),
        ]
        assert [r.status_code for r in refused] == [401, 401, 401, 403]
        assert [r.json()["code"] for r in refused] == ["invalid_token"] * 3 + ["forbidden"]
        # another user of the document: nothing to follow (the chat is alice's)
        assert (await http.get(stream, headers=bearer(token("bob")))).status_code == 204
        for chat_id in ("bad id", "x" * 101, "y" * 5000):  # malformed, oversized
            odd = await http.get(f"{url}/{chat_id}/stream", headers=bearer(token()))
            assert odd.status_code == 204, (chat_id[:10], odd.text)
        for answered in refused:
            assert_clean(answered.text)
        await watcher.send({"type": "run.cancel", "run_id": (
            await watcher.recv_until("run.started"))["run_id"]})
        # carol may not cancel alice's run: she is told so, and the run waits on
        assert (await watcher.recv_until("error"))["code"] == "forbidden"
        status, replay = await sse(http, "GET", stream)  # alice herself still can follow
        assert status == 200 and replay[0]["type"] == "start", replay[:3]


# -- (4) AG-UI --------------------------------------------------------------------------------
# Covered elsewhere (test_adapter_edges, test_adapter_answers, test_adapter_fuzz): malformed,
# oversized, too deep bodies, no / bad / viewer / other-document JWT, an answer to a call
# never made, a repeated run id, approvals that are not booleans.

async def test_agui_a_tool_result_nested_too_deep_inside_its_content_is_refused(
        server: Server) -> None:
    url = f"{server.http}/v1/agui/agui-deep"
    tools = [{k: READ[k] for k in ("name", "description", "parameters")}]

    def agui_input(run_id: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
        return {"threadId": "t1", "runId": run_id, "state": None, "tools": tools,
                "context": [], "forwardedProps": {}, "messages": messages}

    user = {"id": "m1", "role": "user", "content": WITH_TOOL}
    async with joined(server, "agui-deep", sub="bob", client_id="w") as (watcher, _), \
            httpx.AsyncClient() as http:
        status, events = await sse(http, "POST", url, agui_input("r1", [user]))
        call_id = next(e["toolCallId"] for e in events if e["type"] == "TOOL_CALL_START")
        deep = "[" * 100 + "1" + "]" * 100
        status, items = await sse(http, "POST", url, agui_input("r2", [
            user, {"id": "t", "role": "tool", "toolCallId": call_id, "content": deep}]))
        assert status == 400 and items[0]["code"] == "invalid_message", (status, items[:3])
        assert not [e for e in watcher.events if e.get("type") == "tool.done"]
        status, items = await sse(http, "POST", url, agui_input("r3", [
            user, {"id": "t", "role": "tool", "toolCallId": call_id, "content": "[1]"}]))
        assert status == 200 and items[-1]["type"] == "RUN_FINISHED"


# -- (5) the model's output (OpenAI-compatible upstream, tests/fake_openai.py) ---------------
# Covered elsewhere: malformed chunks, a non-JSON `data:` line, an answer that is not a
# stream, an error inside the stream, no finish_reason / length / content_filter
# (test_openai_quirks, test_openai_runs); arguments failing the schema (test_openai_runs) or
# not JSON, unknown tools (test_runs, scripted model).

async def test_model_arguments_that_are_not_json_too_deep_or_for_no_tool_go_to_the_model(
        fake: FakeOpenAI) -> None:
    tools = [OBJECT_TOOL]
    cases = [  # (raw arguments or None for an unknown tool, what the model is told)
        ('{"text": ', "are not valid JSON"),
        ('{"x":' + nested(300) + "}", "are nested too deeply"),  # past the log's encoder
        ('{"x":' + nested(2000) + "}", "are not valid JSON"),  # past orjson's reader
        (None, "unknown tool 'rm_rf'; available tools: note, text_stats"),
    ]
    async with openai_server(fake) as srv, joined(srv) as (client, _):
        for raw, told in cases:
            name = "rm_rf" if raw is None else "note"
            finished, events = await model_run(
                client, fake, Reply(tool_calls=[{"name": name, "arguments": raw or "{}"}]),
                Reply(text=["ok"]), tools=tools)
            assert finished["status"] == "completed", finished
            assert not [e for e in events if e["type"] == "tool.call"]  # never dispatched
            assert told in tool_messages(fake)[-1], tool_messages(fake)[-1]
        assert_clean(client.events)
        await a_new_run_completes(srv, fake=fake)


async def test_model_arguments_and_text_over_the_frame_limit_end_the_run_cleanly(
        fake: FakeOpenAI) -> None:
    """Oversized: the model's text and arguments are not a client's frames; whatever the
    server does with 1.5 MB of them, the run ends once, not `internal`, and the document
    is free."""
    big = "x" * 1_500_000
    async with openai_server(fake) as srv, joined(srv) as (client, _):
        finished, _events = await model_run(
            client, fake, Reply(tool_calls=[{"name": "note", "arguments": {"text": big}}]),
            Reply(text=["ok"]), tools=[OBJECT_TOOL])
        assert finished.get("reason") != "internal_error", finished
        finished, events = await model_run(client, fake, Reply(text=[big]), mode="chat")
        assert finished["status"] == "completed"
        assert sum(len(e["delta"]) for e in events if e["type"] == "message.delta") == len(big)
        assert len([e for e in client.events if e.get("type") == "run.finished"]) == 2
        assert_clean([e for e in client.events if e.get("type") in ("error", "run.finished")])
        await a_new_run_completes(srv, fake=fake)


async def test_model_bytes_that_are_not_utf8_are_a_malformed_stream(fake: FakeOpenAI) -> None:
    def data(event: dict[str, Any]) -> bytes:
        return b"data: " + orjson.dumps(event) + b"\n\n"

    broken = b'data: {"id":"q","object":"chat.completion.chunk","created":0,"model":"m",' \
             b'"choices":[{"index":0,"delta":{"content":"caf\xe9"},"finish_reason":null}]}\n\n'
    body = data(chunk({"content": "fine "})) + broken + data(chunk({}, "stop")) \
        + b"data: [DONE]\n\n"
    async with openai_server(fake) as srv, joined(srv) as (client, _):
        finished, _ = await model_run(
            client, fake, Reply(body=body, content_type="text/event-stream"), mode="chat")
        assert (finished["status"], finished["reason"]) == ("failed", "upstream_error")
        assert finished["error"] == {"code": "upstream_error", "message":
                                     "the model server sent a malformed stream",
                                     "details": {"kind": "bad_request"}}
        await a_new_run_completes(srv, fake=fake)


async def test_model_tool_call_parts_in_an_odd_order_make_one_call(fake: FakeOpenAI) -> None:
    """Out of order: a call's arguments arrive before its id and name, text after the
    finish_reason; the call is assembled by its index, the late text kept."""
    parts = [
        chunk({"content": "", "tool_calls": [{"index": 0, "function": {"arguments": '{"te'}}]}),
        chunk({"content": "", "tool_calls": [{"index": 0, "function": {"arguments": 'xt":1}'}}]}),
        chunk({"content": "", "tool_calls": [{"index": 0, "id": "late", "type": "function",
                                              "function": {"name": "note"}}]}),
        chunk({}, "tool_calls"), chunk({"content": "after the end"}), "[DONE]"]
    async with openai_server(fake) as srv, joined(srv) as (client, _):
        finished, events = await model_run(client, fake, Reply(events=parts),
                                           Reply(text=["ok"]), tools=[OBJECT_TOOL])
        assert finished["status"] == "completed"
        calls = [e for e in events if e["type"] == "tool.call"]
        assert [(c["name"], c["arguments"]) for c in calls] == [("note", {"text": 1})]


SURROGATE_TEXT = ('{"id":"q","object":"chat.completion.chunk","created":0,"model":"m",'
                  '"choices":[{"index":0,"delta":{"content":"bad \\ud800 half"},'
                  '"finish_reason":null}]}')


async def test_model_text_with_a_lone_surrogate_ends_the_run_and_spoils_nothing(
        fake: FakeOpenAI) -> None:
    events = [chunk({"role": "assistant", "content": "fine "}), SURROGATE_TEXT,
              chunk({}, "stop"), "[DONE]"]
    async with openai_server(fake) as srv, joined(srv) as (client, _), \
            httpx.AsyncClient() as http:
        finished, events_seen = await model_run(client, fake, Reply(events=events),
                                                mode="chat", timeout=3)
        assert finished["status"] == "completed", finished
        text = "".join(e["delta"] for e in events_seen if e["type"] == "message.delta")
        assert text == "fine bad \ufffd half"  # the half character shown as U+FFFD
        finished, _ = await model_run(client, fake, Reply(text=["next"]), mode="chat",
                                      timeout=3)
        assert finished["status"] == "completed", finished
        history = await http.get(f"{srv.http}/v1/documents/doc-1/history",
                                 headers={"Authorization": f"Bearer {token()}"})
        assert history.status_code == 200, history.text


async def test_model_tool_name_with_a_lone_surrogate_is_an_unknown_tool(
        fake: FakeOpenAI) -> None:
    named = ('{"id":"q","object":"chat.completion.chunk","created":0,"model":"m","choices":'
             '[{"index":0,"delta":{"content":"","tool_calls":[{"index":0,"id":"c1","type":'
             '"function","function":{"name":"odd\\udc00name","arguments":"{}"}}]},'
             '"finish_reason":null}]}')
    async with openai_server(fake) as srv, joined(srv) as (client, _):
        finished, _ = await model_run(
            client, fake, Reply(events=[named, chunk({}, "tool_calls"), "[DONE]"]),
            Reply(text=["ok"]), timeout=3)
        assert finished["status"] == "completed", finished


async def test_ai_sdk_a_call_with_arguments_nested_past_the_limit_can_be_answered(
        fake: FakeOpenAI) -> None:
    args = '{"x":' + nested(100) + "}"
    fake.replies = [Reply(tool_calls=[{"name": "note", "arguments": args}]), Reply(text=["ok"])]
    async with openai_server(fake) as srv, \
            joined(srv, "deep-args", sub="bob", client_id="w") as (watcher, _), \
            httpx.AsyncClient() as http:
        url = f"{srv.http}/v1/ai-sdk/deep-args/chat"
        user = user_message("hi")
        status, chunks = await sse(http, "POST", url, {"id": "c", "messages": [user],
                                                       "tools": [OBJECT_TOOL]})
        assert status == 200
        for asked in [c for c in chunks if isinstance(c, dict)
                      and c["type"] == "tool-input-available"]:
            reply = {"id": "a", "role": "assistant", "parts": [{
                "type": "tool-note", "toolCallId": asked["toolCallId"],
                "state": "output-available", "input": asked["input"], "output": "noted"}]}
            status, rest = await sse(http, "POST", url, {"id": "c", "messages": [user, reply]})
            assert status == 200, rest
        finished = await watcher.recv_until("run.finished")
        assert finished["status"] == "completed"


# -- (6) server tool and MCP outputs ----------------------------------------------------------
# Covered elsewhere (test_tool_catalog, test_run_server_tools, test_mcp_tools): output over
# the size limit, nested too deep, beyond JSON (2**70), exception text hidden behind a ref,
# ToolError text bounded, sys.exit / cancel inside a tool, timeouts, cancel and abort
# reaching the tool, an MCP server that is down, killed mid-call, slow to start.

async def undecodable_output() -> list[str]:
    """Lists files; one name is not UTF-8 (os.fsdecode keeps its byte as a surrogate)."""
    return ["notes.txt", os.fsdecode(b"caf\xe9.txt")]


async def undecodable_refusal() -> str:
    """Refuses, naming a file whose name is not UTF-8."""
    raise ToolError("cannot open " + os.fsdecode(b"caf\xe9.txt"))


def tools_file(tmp_path: Path, *functions: str) -> Path:
    path = tmp_path / "cowrite.toml"
    path.write_text("".join(f'[[tools]]\nimport = "{__name__}:{name}"\n' for name in functions))
    return path


async def test_a_server_tool_output_with_an_undecodable_name_is_the_tools_failure(
        tmp_path: Path) -> None:
    async with running_server(config=tools_file(tmp_path, "undecodable_output")) as srv, \
            joined(srv) as (client, _):
        ack = await start(client, script({"tool_calls": [call("undecodable_output")]},
                                         {"say": "went on"}), tools=[])
        finished = await client.recv_until(finished_of(ack["run_id"]))
        assert finished["status"] == "completed"
        (done,) = of_run(client.events, ack["run_id"], "tool.done")
        assert done["status"] == "error" and done["error"]["code"] == "internal"
        assert done["error"]["message"].startswith("tool failed (ref ")
        assert_clean(client.events)
        await a_new_run_completes(srv)


async def test_a_server_tool_refusal_naming_an_undecodable_file_is_a_tool_error(
        tmp_path: Path) -> None:
    async with running_server(config=tools_file(tmp_path, "undecodable_refusal")) as srv, \
            joined(srv) as (client, _):
        ack = await start(client, script({"tool_calls": [call("undecodable_refusal")]},
                                         {"say": "went on"}), tools=[])
        finished = await client.recv_until(finished_of(ack["run_id"]))
        assert finished["status"] == "completed", finished
        (done,) = of_run(client.events, ack["run_id"], "tool.done")
        assert done["status"] == "error" and done["error"]["code"] == "tool_error", done


# A stdio MCP server that answers some calls badly: `refuse` with a JSON-RPC error of code
# -32000 (the first "server error" code of JSON-RPC 2.0, which servers use for their own
# failures), `garbage` with a line that is not JSON, `ok` properly.
BAD_MCP = r'''
import json, sys
def send(text): sys.stdout.write(text + "\n"); sys.stdout.flush()
for line in sys.stdin:
    msg = json.loads(line); mid, method = msg.get("id"), msg.get("method")
    if method == "initialize":
        send(json.dumps({"jsonrpc": "2.0", "id": mid, "result": {
            "protocolVersion": msg["params"]["protocolVersion"], "capabilities": {"tools": {}},
            "serverInfo": {"name": "bad", "version": "1"}}}))
    elif method == "tools/list":
        send(json.dumps({"jsonrpc": "2.0", "id": mid, "result": {"tools": [
            {"name": n, "description": n, "inputSchema": {"type": "object"}}
            for n in ("ok", "refuse", "garbage")]}}))
    elif method == "tools/call":
        name = msg["params"]["name"]
        if name == "refuse":
            send(json.dumps({"jsonrpc": "2.0", "id": mid, "error": {
                "code": -32000, "message": "Traceback (most recent call last): /srv/x.py"}}))
        elif name == "garbage":
            send("{this is not json")
        else:
            send(json.dumps({"jsonrpc": "2.0", "id": mid, "result": {
                "content": [{"type": "text", "text": "fine"}]}}))
    elif mid is not None:
        send(json.dumps({"jsonrpc": "2.0", "id": mid, "result": {}}))
'''


def mcp_file(tmp_path: Path) -> Path:
    server_script = tmp_path / "bad_mcp.py"
    server_script.write_text(BAD_MCP)
    path = tmp_path / "cowrite.toml"
    path.write_text(f'[[mcp]]\nname = "bad"\ncommand = [{orjson.dumps(sys.executable).decode()},'
                    f' {orjson.dumps(str(server_script)).decode()}]\n'
                    "requires_approval = false\ntimeout_s = 1\n")
    return path


async def mcp_ready(srv: Server) -> None:
    tools: ToolCatalog = srv.app.state.tools
    await until(tools, lambda: "bad__ok" in {s.name for s in tools.specs()})


async def test_an_mcp_reply_that_is_not_json_is_a_timeout_and_the_run_goes_on(
        tmp_path: Path) -> None:
    async with running_server(config=mcp_file(tmp_path)) as srv, joined(srv) as (client, _):
        await mcp_ready(srv)
        ack = await start(client, script({"tool_calls": [call("bad__garbage")]},
                                         {"tool_calls": [call("bad__ok")]}, {"say": "on"}),
                          tools=[])
        finished = await client.recv_until(finished_of(ack["run_id"]))
        assert finished["status"] == "completed"
        dones = of_run(client.events, ack["run_id"], "tool.done")
        assert [(d["status"], d.get("output")) for d in dones] == [("timeout", None),
                                                                   ("ok", "fine")]
        assert_clean(client.events)


async def test_an_mcp_error_reply_is_a_refusal_and_the_server_stays_up(tmp_path: Path) -> None:
    async with running_server(config=mcp_file(tmp_path)) as srv, joined(srv) as (client, _):
        await mcp_ready(srv)
        ack = await start(client, script({"tool_calls": [call("bad__refuse")]},
                                         {"tool_calls": [call("bad__ok")]}, {"say": "on"}),
                          tools=[])
        finished = await client.recv_until(finished_of(ack["run_id"]))
        assert finished["status"] == "completed"
        assert_clean(client.events)
        dones = of_run(client.events, ack["run_id"], "tool.done")
        assert [d["status"] for d in dones] == ["error", "ok"], dones
        assert dones[0]["error"]["code"] == "tool_error", dones[0]


# -- (7) the config file (COWRITE_CONFIG) and the environment ---------------------------------
# Covered elsewhere: malformed TOML, not UTF-8, unknown keys, wrong types, duplicates,
# missing file (test_tool_catalog, test_tools_http); bad / out-of-range settings in one line
# without secrets (test_startup_errors, test_settings_checks). An unreadable file cannot be
# made so for root; a directory stands for it.

async def start_with_config(path: Path) -> tuple[int | None, list[str]]:
    """`python -m server` with COWRITE_CONFIG=path: exit code and stderr lines."""
    env = {**os.environ, "COWRITE_CONFIG": str(path),
           "COWRITE_JWT_SECRET": "test-secret-0123456789abcdef0123456789", "COWRITE_PORT": "0"}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "server", cwd=ROOT, env=env,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    try:
        _, stderr = await asyncio.wait_for(process.communicate(), 30)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    return process.returncode, stderr.decode().splitlines()


async def test_a_config_path_that_cannot_be_read_is_one_line(tmp_path: Path) -> None:
    code, lines = await start_with_config(tmp_path)  # a directory
    assert (code, lines) == (2, [f"cowrite: COWRITE_CONFIG {tmp_path}: cannot read it "
                                 "(Is a directory)"])


async def test_a_config_nested_too_deeply_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "deep.toml"
    path.write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")
    code, lines = await start_with_config(path)
    assert code == 2 and len(lines) == 1, lines[-3:]
    assert lines[0].startswith(f"cowrite: COWRITE_CONFIG {path}: ")
