"""Client strings that the server logs or hands to the model are bounded.

A security review filled a server's memory through `editor.change`: its
`document_version` (any string up to the 1 MiB frame) is logged with every
`document.changed`, and a document's log keeps 10,000 events whatever their size
(600 edits with a 500 KB version: +290 MB in 9 s, held for an hour; in Redis with
a shared backend). A version is now an integer or a string of at most 128
characters, wherever a client sends one; summaries and reasons, which reach the
model or the logs, at most 2,000 characters. Over that: `invalid_message` naming
the field, nothing logged, and the run (if any) goes on.
"""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from protocol.base import NOTE_MAX_CHARS, VERSION_MAX_CHARS
from tests.adapter_support import sse
from tests.harness import Server, joined, running_server, token
from tests.runs import answer, call, script, start
from tests.test_adapter_answers import _agui

LONG_VERSION = "v" * (VERSION_MAX_CHARS + 1)
LONG_NOTE = "n" * (NOTE_MAX_CHARS + 1)


def replying_to(tag: str) -> Callable[[dict[str, Any]], bool]:
    return lambda e: e.get("reply_to") == tag


def refused(event: dict[str, Any], field: str) -> bool:
    return event["type"] == "error" and event["code"] == "invalid_message" and \
        field in str(event.get("details")) + event["message"]


async def test_an_edit_with_an_oversized_version_or_summary_is_refused_and_not_logged(
        server: Server) -> None:
    async with joined(server, "bounded") as (client, welcome):
        for tag, fields, field in (
                ("version", {"document_version": LONG_VERSION}, "document_version"),
                ("summary", {"summary": LONG_NOTE}, "summary")):
            await client.send({"type": "editor.change", "id": tag, **fields})
            answer_ = await client.recv_until(replying_to(tag))
            assert refused(answer_, field), answer_
        await client.send({"type": "editor.change", "id": "fits",
                           "document_version": "v" * VERSION_MAX_CHARS,
                           "summary": "n" * NOTE_MAX_CHARS})
        changed = await client.recv_until("document.changed")
        assert changed["seq"] == welcome["last_seq"] + 1  # the refused ones logged nothing
        assert changed["document_version"] == "v" * VERSION_MAX_CHARS


async def test_a_tool_result_with_an_oversized_version_leaves_the_call_waiting(
        server: Server) -> None:
    async with joined(server, "bounded-tool") as (client, _), httpx.AsyncClient() as http:
        ack = await start(client, script({"tool_calls": [call("read_document")]},
                                         {"say": "done"}))
        tool_call = await client.recv_until("tool.call")
        await answer(client, tool_call, {"text": "hi"}, id="long",
                     document_version=LONG_VERSION)
        assert refused(await client.recv_until(lambda e: e.get("reply_to") == "long"),
                       "document_version")
        url = f"{server.http}/v1/documents/bounded-tool/runs/{ack['run_id']}/tool-results"
        posted = await http.post(url, headers={"Authorization": f"Bearer {token()}"}, json={
            "call_id": tool_call["call_id"], "token": tool_call["token"], "output": 1,
            "document_version": LONG_VERSION})
        assert posted.status_code == 400 and posted.json()["code"] == "invalid_message"
        await client.send({"type": "run.cancel", "id": "why", "run_id": ack["run_id"],
                           "reason": LONG_NOTE})
        assert refused(await client.recv_until(lambda e: e.get("reply_to") == "why"),
                       "reason")
        await answer(client, tool_call, {"text": "hi"}, id="ok", document_version=7)
        assert (await client.recv_until(lambda e: e.get("reply_to") == "ok"))["type"] == "ack"
        finished = await client.recv_until("run.finished")
        assert finished["status"] == "completed"


async def test_an_adapters_long_rejection_reason_is_cut_not_a_500(tmp_path: Path) -> None:
    """An AG-UI (or AI SDK) rejection's reason is the frontend's text: over the 2,000
    characters a WebSocket client may send, building the approval failed the request
    with a 500 and left the approval pending. It is cut to 2,000 characters."""
    config = tmp_path / "cowrite.toml"
    config.write_text('[[tools]]\nimport = "tests.tool_fixtures:greet"\n'
                      'requires_approval = true\n')
    user = {"id": "m1", "role": "user", "content": script(
        {"tool_calls": [{"name": "greet", "arguments": {"name": "A"}}]}, {"say": "Ok."})}
    async with running_server(config=config) as server, httpx.AsyncClient() as http, \
            joined(server, "reason", sub="bob", client_id="watcher") as (watcher, _):
        url = f"{server.http}/v1/agui/reason"
        _, first = await sse(http, "POST", url, _agui("p1", [user]))
        call_id = first[-1]["outcome"]["interrupts"][0]["id"]
        entry = {"interruptId": call_id, "status": "resolved",
                 "payload": {"approved": False, "reason": LONG_NOTE}}
        status, rest = await sse(http, "POST", url, _agui("p2", [user], resume=[entry]))
        assert status == 200 and rest[-1]["type"] == "RUN_FINISHED", rest[-1]
        done = await watcher.recv_until("tool.done")
        assert done["status"] == "rejected"
