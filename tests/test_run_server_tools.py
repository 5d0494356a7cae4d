"""Server tools, MCP tools, workflows and threads inside real runs (PROTOCOL.md 14, 15),
over real sockets: the operator's TOML file, a real MCP server, the OpenAI path."""

import asyncio
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests import tool_fixtures
from tests.fake_openai import FakeOpenAI, Reply, running_fake_openai
from tests.harness import Server, joined, running_server, token
from tests.runs import READ, answer, call, of_run, script, start
from tests.tool_support import file_says

TOOLS_TOML = """
[[tools]]
import = "tests.tool_fixtures:greet"
[[tools]]
import = "tests.tool_fixtures:explode"
[[tools]]
import = "tests.tool_fixtures:refuse"
[[tools]]
import = "tests.tool_fixtures:sleepy"
timeout_s = {sleepy_timeout}
"""
GUARDED_TOML = """
[[tools]]
import = "tests.tool_fixtures:greet"
requires_approval = true
"""
MCP_TOML = f"""
[[mcp]]
name = "fixture"
command = [{orjson.dumps(sys.executable).decode()}, "-m", "tests.mcp_fixture_server"]
requires_approval = false
tools = ["add", "slow"]
"""
WORKFLOW_TOML = """
[[workflows]]
name = "proofread"
title = "Proofread"
system_prompt = "You proofread. Change only spelling."
tools = ["read_document", "text_stats"]
approval = ["read_document"]
max_steps = 3
"""


def config_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cowrite.toml"
    path.write_text(text)
    return path


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with running_fake_openai() as fake_server:
        yield fake_server


def event_of(run_id: str, kind: str) -> Callable[[dict[str, Any]], bool]:
    return lambda e: e.get("run_id") == run_id and e.get("type") == kind


def reply_to(message_id: str) -> Callable[[dict[str, Any]], bool]:
    return lambda e: e.get("reply_to") == message_id


def done_of(events: list[dict[str, Any]], run_id: str) -> dict[str, dict[str, Any]]:
    calls = {e["call_id"]: e["name"] for e in of_run(events, run_id, "tool.call")}
    return {calls[e["call_id"]]: e for e in of_run(events, run_id, "tool.done")
            if e["call_id"] in calls}


async def test_python_tools_run_on_the_server_and_failures_hide_their_text(tmp_path: Path
                                                                            ) -> None:
    path = config_file(tmp_path, TOOLS_TOML.format(sleepy_timeout=5))
    calls = [{"name": "greet", "arguments": {"name": "bob"}}, call("explode"),
             call("refuse", reason="policy"), call("text_stats", text="one two")]
    async with running_server(config=path) as srv, joined(srv) as (alice, welcome):
        assert {"server_tools", "mcp", "workflows", "threads"} <= set(welcome["features"])
        ack = await start(alice, script({"tool_calls": calls}, {"say": "done"}), tools=[])
        finished = await alice.recv_until("run.finished")
        assert finished["status"] == "completed"
        done = done_of(alice.events, ack["run_id"])
        assert {c["executor"] for c in of_run(alice.events, ack["run_id"], "tool.call")} == {
            "server"}
        assert done["greet"]["status"] == "ok"
        assert done["greet"]["output"]["text"] == "hello bob from alice on doc-1"
        assert done["text_stats"]["output"]["words"] == 2  # the built-in, loaded the same way
        assert done["refuse"]["error"]["message"] == "refused: policy"
        hidden = done["explode"]["error"]["message"]
        assert hidden.startswith("tool failed (ref ") and "hunter2" not in hidden


async def test_a_server_tool_output_over_the_size_limit_is_its_failure(tmp_path: Path
                                                                        ) -> None:
    path = config_file(tmp_path, TOOLS_TOML.format(sleepy_timeout=5))
    big = {"name": "greet", "arguments": {"name": "bob", "times": 400}}  # ~11 KB of JSON
    small = {"name": "greet", "arguments": {"name": "bob", "times": 2}}
    async with running_server(config=path, max_message_bytes=4096) as srv, \
            joined(srv) as (alice, _):
        ack = await start(alice, script({"tool_calls": [big]}, {"tool_calls": [small]},
                                        {"say": "done"}), tools=[])
        finished = await alice.recv_until("run.finished")
        assert finished["status"] == "completed" and finished["steps"] == 3
        done = of_run(alice.events, ack["run_id"], "tool.done")
        assert [d["status"] for d in done] == ["error", "ok"]
        assert done[0]["error"]["code"] == "too_large" and "output" not in done[0]
        assert done[0]["error"]["message"].startswith("greet returned ")
        assert done[0]["error"]["message"].endswith(" bytes of output; the limit is 4096")
        assert done[1]["output"]["text"].count("hello bob") == 2


async def test_a_tool_past_its_timeout_ends_timeout_and_the_run_goes_on(tmp_path: Path) -> None:
    path = config_file(tmp_path, TOOLS_TOML.format(sleepy_timeout=0.2))
    tool_fixtures.OBSERVERS["timeout"] = asyncio.Queue()
    async with running_server(config=path) as srv, joined(srv) as (alice, _):
        ack = await start(alice, script(
            {"tool_calls": [call("sleepy", key="timeout", seconds=30)]}, {"say": "after"}),
            tools=[])
        finished = await alice.recv_until("run.finished")
        assert finished["status"] == "completed" and finished["steps"] == 2
        assert done_of(alice.events, ack["run_id"])["sleepy"]["status"] == "timeout"
        observed = tool_fixtures.OBSERVERS["timeout"]
        assert [observed.get_nowait(), observed.get_nowait()] == ["started", "cancelled"]


@pytest.mark.parametrize("ending", ["run.cancel", "editor.change"])
async def test_cancel_and_abort_reach_the_running_python_tool(tmp_path: Path,
                                                              ending: str) -> None:
    path = config_file(tmp_path, TOOLS_TOML.format(sleepy_timeout=30))
    observed = tool_fixtures.OBSERVERS[ending] = asyncio.Queue()
    async with running_server(config=path) as srv, joined(srv) as (alice, _):
        ack = await start(alice, script({"tool_calls": [call("sleepy", key=ending,
                                                              seconds=30)]}), tools=[])
        assert await asyncio.wait_for(observed.get(), 5) == "started"
        if ending == "run.cancel":
            await alice.send({"type": "run.cancel", "run_id": ack["run_id"]})
        else:
            await alice.send({"type": "editor.change"})
        assert await asyncio.wait_for(observed.get(), 5) == "cancelled"
        finished = await alice.recv_until("run.finished")
        assert finished["status"] == ("cancelled" if ending == "run.cancel" else "aborted")
        assert done_of(alice.events, ack["run_id"])["sleepy"]["status"] == "cancelled"


async def test_a_misbehaving_python_tool_neither_stops_the_server_nor_holds_the_document(
        tmp_path: Path) -> None:
    """A tool calling sys.exit() stopped the server; one whose inner operation was
    cancelled left the run waiting until the run timeout; one ignoring cancellation
    kept the document busy after `run.finished` until it chose to return."""
    path = config_file(tmp_path, """
[[tools]]
import = "tests.tool_fixtures:exits"
[[tools]]
import = "tests.tool_fixtures:inner_cancelled"
[[tools]]
import = "tests.tool_fixtures:stubborn"
timeout_s = 30
""")
    observed = tool_fixtures.OBSERVERS["run-stubborn"] = asyncio.Queue()
    async with running_server(config=path) as srv, joined(srv) as (alice, _), \
            joined(srv, sub="bob", client_id="bob-tab") as (bob, _):
        ack = await start(alice, script({"tool_calls": [call("exits"), call("inner_cancelled")]},
                                        {"say": "still here"}), tools=[])
        finished = await alice.recv_until("run.finished")
        assert finished["status"] == "completed"
        done = done_of(alice.events, ack["run_id"])
        assert {done[name]["error"]["code"] for name in ("exits", "inner_cancelled")} == {
            "internal"}
        ack = await start(alice, script({"tool_calls": [call("stubborn", key="run-stubborn",
                                                             seconds=4)]}), tools=[])
        await alice.recv_until(event_of(ack["run_id"], "tool.call"))
        await alice.send({"type": "run.cancel", "run_id": ack["run_id"]})
        assert (await alice.recv_until(event_of(ack["run_id"], "run.finished")))[
            "status"] == "cancelled"
        assert await asyncio.wait_for(observed.get(), 5) == "ignored a cancel"
        for attempt in range(100):  # freed once the tool had its second to stop
            asked = f"s{attempt}"
            await bob.send({"type": "run.start", "id": asked, "tools": [],
                            "prompt": script({"say": "my turn"})})
            reply = await bob.recv_until(reply_to(asked))
            if reply["type"] == "ack":
                break
            assert reply["code"] == "document_busy"
            await asyncio.sleep(0.1)
        assert reply["type"] == "ack" and reply["status"] == "running"
        assert observed.empty()  # the tool still runs (4 s), the document goes on without it


async def test_server_tool_approval_comes_first(tmp_path: Path) -> None:
    path = config_file(tmp_path, GUARDED_TOML)
    greet = {"name": "greet", "arguments": {"name": "carol"}}
    async with running_server(config=path) as srv, joined(srv) as (alice, _):
        ack = await start(alice, script({"tool_calls": [greet]}), tools=[])
        requested = await alice.recv_until("approval.requested")
        assert requested["name"] == "greet"
        assert not of_run(alice.events, ack["run_id"], "tool.call")  # nothing ran yet
        await alice.send({"type": "approval", "run_id": ack["run_id"],
                          "call_id": requested["call_id"], "decision": "approve"})
        assert (await alice.recv_until("run.finished"))["status"] == "completed"
        output = done_of(alice.events, ack["run_id"])["greet"]["output"]
        assert output["text"] == "hello carol from alice on doc-1"


async def test_a_client_call_after_a_server_tool_in_one_turn_can_be_answered(
        server: Server) -> None:
    """The call after a server tool in the same model turn was opened as of time 0:
    its deadline was in 1970, its token expired at birth, the run timed out."""
    async with joined(server) as (alice, _):
        before_ms = time.time() * 1000
        ack = await start(alice, script({"tool_calls": [call("text_stats", text="a b"),
                                                        call("read_document")]},
                                        {"say": "done"}), tools=[READ])
        tool_call = await alice.recv_until(lambda e: e.get("type") == "tool.call"
                                           and e.get("executor") == "client")
        assert tool_call["expires_at"] >= before_ms + 60_000
        await answer(alice, tool_call, {"text": "the document"}, id="r")
        assert (await alice.recv_until(reply_to("r")))["type"] == "ack"
        finished = await alice.recv_until(event_of(ack["run_id"], "run.finished"))
        assert finished["status"] == "completed"


async def test_mcp_tools_in_a_run_and_a_cancel_reaches_the_mcp_server(tmp_path: Path) -> None:
    path = config_file(tmp_path, MCP_TOML)
    log = tmp_path / "mcp.log"
    async with running_server(config=path) as srv, joined(srv) as (alice, _):
        ack = await start(alice, script(
            {"tool_calls": [call("fixture__add", a=2, b=3)]},
            {"tool_calls": [call("fixture__slow", key="k", seconds=30, log=str(log))]}),
            tools=[])
        added = await alice.recv_until("tool.done")
        assert added["status"] == "ok" and added["output"] == {"result": 5}
        await file_says(log, "started k")
        await alice.send({"type": "run.cancel", "run_id": ack["run_id"]})
        assert (await alice.recv_until("run.finished"))["status"] == "cancelled"
        await file_says(log, "cancelled k")  # notifications/cancelled arrived


async def test_a_client_tool_named_like_a_server_tool_is_refused(server: Server) -> None:
    async with joined(server) as (alice, _):
        await alice.send({"type": "run.start", "id": "s", "prompt": "p",
                          "tools": [READ, {"name": "text_stats"}]})
        error = await alice.recv_until(lambda e: e.get("reply_to") == "s")
        assert error["code"] == "invalid_message" and error["details"][0]["loc"] == [
            "tools", 1, "name"]


async def test_workflows_set_prompt_tools_approvals_and_unknown_names_are_refused(
        fake: FakeOpenAI, tmp_path: Path) -> None:
    fake.replies = [Reply(tool_calls=[{"name": "read_document", "arguments": {}}])]
    path = config_file(tmp_path, WORKFLOW_TOML)
    async with running_server(llm="openai", openai_api_key="sk-test", model="m",
                              openai_base_url=fake.base_url, config=path) as srv, \
            joined(srv) as (alice, _):
        await alice.send({"type": "run.start", "id": "x", "prompt": "p", "workflow": "nope"})
        refused = await alice.recv_until(lambda e: e.get("reply_to") == "x")
        assert refused["code"] == "invalid_message" and refused["details"][0]["loc"] == [
            "workflow"]
        ack = await start(alice, "fix my spelling", workflow="proofread")
        requested = await alice.recv_until("approval.requested")  # the workflow's approval
        assert requested["name"] == "read_document"
        await alice.send({"type": "run.cancel", "run_id": ack["run_id"]})
        await alice.recv_until("run.finished")
    request = fake.requests[0]
    assert request["messages"][0] == {"role": "system",
                                      "content": "You proofread. Change only spelling."}
    assert {t["function"]["name"] for t in request["tools"]} == {"read_document", "text_stats"}


async def test_server_tool_schemas_reach_the_upstream_unchanged(fake: FakeOpenAI,
                                                                tmp_path: Path) -> None:
    fake.replies = [Reply(text=["ok"])]
    path = config_file(tmp_path, TOOLS_TOML.format(sleepy_timeout=5))
    async with running_server(llm="openai", openai_api_key="sk-test", model="m",
                              openai_base_url=fake.base_url, config=path) as srv:
        async with httpx.AsyncClient(base_url=srv.http) as http:
            listed = (await http.get("/v1/tools", headers={
                "Authorization": f"Bearer {token()}"})).json()["tools"]
        async with joined(srv) as (alice, _):
            await start(alice, "hi", tools=[])
            await alice.recv_until("run.finished")
    upstream = {t["function"]["name"]: t["function"]["parameters"]
                for t in fake.requests[0]["tools"]}
    for tool in listed:
        if tool["available"]:
            assert upstream[tool["name"]] == tool["parameters"], tool["name"]


async def test_threads_keep_separate_histories(fake: FakeOpenAI) -> None:
    fake.replies = [Reply(text=["a1"]), Reply(text=["b1"]), Reply(text=["a2"])]
    async with running_server(llm="openai", openai_api_key="sk-test", model="m",
                              openai_base_url=fake.base_url) as srv, \
            joined(srv) as (alice, _):
        for thread, prompt in (("a", "alpha"), ("b", "beta"), ("a", "again")):
            ack = await start(alice, prompt, thread_id=thread)
            started = await alice.recv_until(event_of(ack["run_id"], "run.started"))
            assert started["thread_id"] == thread
            await alice.recv_until(event_of(ack["run_id"], "run.finished"))
        await alice.send({"type": "run.start", "id": "bad", "prompt": "p",
                          "thread_id": "no spaces"})
        assert (await alice.recv_until(lambda e: e.get("reply_to") == "bad"))["code"] == \
            "invalid_message"
        async with httpx.AsyncClient(base_url=srv.http,
                                     headers={"Authorization": f"Bearer {token()}"}) as http:
            listed = (await http.get("/v1/documents/doc-1/threads")).json()["threads"]
            only_b = (await http.get("/v1/documents/doc-1/history?thread=b")).json()
    seen = [" ".join(str(m["content"]) for m in r["messages"]) for r in fake.requests]
    assert "alpha" not in seen[1]  # thread b does not see thread a
    assert "alpha" in seen[2] and "a1" in seen[2] and "beta" not in seen[2]
    assert {t["thread_id"]: t["runs"] for t in listed} == {"a": 2, "b": 1}
    assert [m["content"] for m in only_b["messages"]] == ["beta", "b1"]
