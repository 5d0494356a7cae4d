"""MCP servers that misbehave: a huge or non-UTF-8 stdout line, a crash before the
handshake, an HTTP server that lost its sessions, listings checked again and again,
draft-07 schemas, and config values past any sense. Real subprocesses and sockets:
`tests/mcp_raw_server.py` over stdio, a stateful HTTP server on a free port."""

import asyncio
import logging
import os
import sys
import time
import tomllib
import uuid
from pathlib import Path
from typing import Any

import httpx
import mcp.types as mcp_types
import orjson
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from protocol.client import ToolSpec
from server.agent.tools import check_tool_schemas
from server.tools import mcp_results, mcp_source
from server.tools.config import ConfigError, parse_config
from server.tools.mcp_source import McpTimings
from tests.harness import free_port, joined, running_server, token
from tests.log_records import records_of
from tests.runs import call, of_run, script, start
from tests.tool_support import available, tool_context
from tests.tool_support import started_catalog as started

ROOT = Path(__file__).resolve().parent.parent


def raw_toml(name: str = "raw", env: dict[str, str] | None = None, extra: str = "") -> str:
    command = orjson.dumps([sys.executable, "-m", "tests.mcp_raw_server"]).decode()
    env_toml = ", ".join(f"{k} = {orjson.dumps(v).decode()}" for k, v in (env or {}).items())
    return (f'[[mcp]]\nname = "{name}"\ncommand = {command}\n'
            f'cwd = {orjson.dumps(str(ROOT)).decode()}\nenv = {{ {env_toml} }}\n'
            f"requires_approval = false\n{extra}")


async def test_a_huge_stdio_answer_neither_freezes_the_instance_nor_is_read_whole(
        tmp_path: Path) -> None:
    """The SDK's stdio reader joined and split its text buffer on every 64 KB read: a
    30 MB answer held the event loop for seconds (every document, /healthz), and was
    read whole only to be refused as too large. A line is now cut at twice
    COWRITE_MAX_MESSAGE_BYTES: the call fails, the server is restarted."""
    config = tmp_path / "cowrite.toml"
    config.write_text(raw_toml(extra="timeout_s = 60\n"))
    async with running_server(config=config) as srv, joined(srv) as (alice, _), \
            httpx.AsyncClient(base_url=srv.http) as http:
        await start(alice, script({"tool_calls": [call("raw__huge", mb=30)]}, {"say": "done"}),
                    tools=[])
        # One event loop runs the server and this test: time the loop spends on anything
        # but a round of /healthz shows as the round's delay.
        worst = stalled = 0.0
        done = asyncio.create_task(alice.recv_until("tool.done", timeout=60))
        while not done.done():
            began = time.monotonic()
            assert (await http.get("/healthz")).status_code == 200
            await asyncio.sleep(0.02)
            took = time.monotonic() - began
            worst, stalled = max(worst, took), stalled + max(0.0, took - 0.05)
        tool_done = await done
        print(f"worst /healthz round {worst:.2f} s; rounds delayed {stalled:.2f} s in all")
        assert worst < 1.0 and stalled < 1.0, (worst, stalled)
        assert tool_done["status"] == "error"
        assert tool_done["error"] == {
            "code": "unavailable",
            "message": "MCP server raw sent a message over 2097152 bytes; it is being restarted"}
        await alice.recv_until("run.finished", timeout=30)
        auth = {"Authorization": f"Bearer {token()}"}
        async with asyncio.timeout(20):  # restarted in the background
            while not {t["name"]: t["available"] for t in  # noqa: ASYNC110 - polled over HTTP
                       (await http.get("/v1/tools", headers=auth)).json()["tools"]}["raw__echo"]:
                await asyncio.sleep(0.1)
        again = await start(alice, script({"tool_calls": [call("raw__echo", text="hi")]},
                                          {"say": "ok"}), tools=[])
        async with asyncio.timeout(30):
            while not of_run(alice.events, again["run_id"], "run.finished"):
                await alice.recv(timeout=30)
        [echo] = of_run(alice.events, again["run_id"], "tool.done")
        assert (echo["status"], echo["output"]) == ("ok", "hi")  # restarted, in use again


async def test_a_stdout_line_that_is_not_utf8_is_one_ignored_line(tmp_path: Path) -> None:
    """Strict decoding failed inside the SDK's drain of stdout: the connection hung, and
    every call to the server waited out its timeout until the next poll (~40 s)."""
    with records_of("cowrite.tools.mcp") as records:
        async with started(raw_toml()) as tools:
            bad = await tools.invoke("raw__badutf8", {}, tool_context())
            echo = await tools.invoke("raw__echo", {"text": "still here"}, tool_context())
    assert (bad.status, bad.output) == ("ok", "after the bad bytes")
    assert (echo.status, echo.output) == ("ok", "still here")
    [ignored] = [r.getMessage() for r in records if "not a JSON-RPC message" in r.getMessage()]
    assert ignored.startswith("mcp server raw wrote a line to stdout that is not a JSON-RPC "
                              "message (ignored; 1 so far)")


async def test_a_server_that_exits_before_the_handshake_is_one_line_naming_why(
        capfd: pytest.CaptureFixture[str]) -> None:
    """It logged "connection closed", and the child's traceback went to cowrite's
    stderr on every restart."""
    fast = McpTimings(retry_min_s=0.05, retry_max_s=0.05)
    with records_of("cowrite.tools.mcp") as records:
        async with started(raw_toml("notes", {"RAW_FAIL_START": "1"}), fast) as tools:
            problem = tools.describe()[-1]["problem"]
            await asyncio.sleep(0.6)  # several restarts
    assert problem == "MCP server notes is down (its process exited with code 1); restarting"
    down = [r for r in records if r.getMessage().startswith("mcp server notes is down")]
    assert len(down) >= 3
    assert down[0].getMessage() == (
        "mcp server notes is down: process exited with code 1 before the handshake; its last "
        "stderr line: \"ModuleNotFoundError: No module named 'notes_backend'\"; restarting in "
        "the background")
    assert [r.levelno for r in down][:2] == [logging.WARNING, logging.DEBUG]
    tails = [r for r in records if "the last 3 lines of its stderr" in r.getMessage()]
    assert tails[0].getMessage() == (
        "mcp server notes: the last 3 lines of its stderr: Traceback (most recent call last): "
        "| File \"server.py\", line 1, in <module> | ModuleNotFoundError: No module named "
        "'notes_backend'")
    assert [r.levelno for r in tails][:2] == [logging.WARNING, logging.DEBUG]
    printed = capfd.readouterr().err.splitlines()  # the child's stderr, not our log's lines
    assert not [line for line in printed if line.startswith("ModuleNotFoundError")]


async def test_a_stdio_server_that_dies_while_idle_is_noticed_at_once(tmp_path: Path) -> None:
    """A 2025-06-18 stdio server has no listen stream: its end was noticed by the next
    poll (COWRITE_MCP_POLL_S, 30 s), its tools offered meanwhile. Its stdout ending now
    wakes the supervisor."""
    async with started(raw_toml()) as tools:
        pid = int((await tools.invoke("raw__pid", {}, tool_context())).output)
        began = time.monotonic()
        await asyncio.create_subprocess_exec("kill", "-9", str(pid))
        async with asyncio.timeout(10):
            while available(tools)["raw__pid"]:
                await tools.changed()
        assert time.monotonic() - began < 10
        async with asyncio.timeout(10):
            while not available(tools)["raw__pid"]:
                await tools.changed()
        assert int((await tools.invoke("raw__pid", {}, tool_context())).output) != pid


async def test_a_stdio_server_that_dies_while_its_helper_holds_stdout_is_noticed(
        tmp_path: Path) -> None:
    """A server killed while a process it started (inheriting its stdout) runs on: its
    stdout never ended, so the call in flight waited out its timeout (60 s here) and the
    tools stayed offered until the next poll. Its exit now ends the connection."""
    pid_file = tmp_path / "helper.pid"
    toml = raw_toml("raw", {"RAW_HELPER": str(pid_file), "RAW_HELPER_STDOUT": "1",
                            "RAW_LOG": str(tmp_path / "raw.log")}, extra="timeout_s = 60\n")
    async with started(toml) as tools:
        pid = int((await tools.invoke("raw__pid", {}, tool_context())).output)
        helper = int(pid_file.read_text())
        stalled = asyncio.create_task(tools.invoke("raw__stall", {}, tool_context()))
        async with asyncio.timeout(10):
            while "call stall" not in (tmp_path / "raw.log").read_text():  # noqa: ASYNC110
                await asyncio.sleep(0.02)
        os.kill(pid, 9)
        result = await asyncio.wait_for(stalled, 10)
        assert result.status == "error" and result.error is not None
        assert result.error["code"] == "unavailable", result.error
        async with asyncio.timeout(10):  # restarted: a new process answers
            while not available(tools)["raw__pid"] or int(
                    (await tools.invoke("raw__pid", {}, tool_context())).output) == pid:
                await tools.changed()
    assert _process_state(helper) in (None, "Z"), "the dead server's helper still runs"


class StatefulHttpMcp:
    """A 2025-06-18 streamable-HTTP server as most are deployed: a session id from
    `initialize`, 404 with -32001 for a session it does not know, no GET stream.
    `forget()` is its restart: every session lost."""

    def __init__(self) -> None:
        self.sessions: set[str] = set()
        self.port = free_port()
        app = Starlette(routes=[Route("/mcp", self._mcp, methods=["GET", "POST", "DELETE"])])
        self._server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port,
                                                     log_level="warning", lifespan="off"))
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> "StatefulHttpMcp":
        self._task = asyncio.create_task(self._server.serve())
        while not self._server.started:  # noqa: ASYNC110 - uvicorn offers no event
            await asyncio.sleep(0.01)
        return self

    async def __aexit__(self, *_: object) -> None:
        self._server.should_exit = True
        assert self._task is not None
        await asyncio.wait_for(self._task, 10)

    def forget(self) -> None:
        self.sessions.clear()

    async def _mcp(self, request: Request) -> Response:
        if request.method != "POST":
            return Response(status_code=405 if request.method == "GET" else 200)
        message = orjson.loads(await request.body())
        method, mid = message.get("method"), message.get("id")
        if method == "initialize":
            session = uuid.uuid4().hex
            self.sessions.add(session)
            return JSONResponse({"jsonrpc": "2.0", "id": mid, "result": {
                "protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
                "serverInfo": {"name": "old", "version": "1"}}},
                headers={"mcp-session-id": session})
        if request.headers.get("mcp-session-id") not in self.sessions:
            return JSONResponse({"jsonrpc": "2.0", "id": None, "error": {
                "code": -32001, "message": "Session not found"}}, status_code=404)
        if mid is None:
            return Response(status_code=202)
        result: dict[str, Any] = {}
        if method == "tools/list":
            result = {"tools": [{"name": "add", "inputSchema": {"type": "object", "properties": {
                "a": {"type": "integer"}, "b": {"type": "integer"}}}}]}
        elif method == "tools/call":
            arguments = message["params"]["arguments"]
            result = {"content": [{"type": "text", "text": str(arguments["a"] + arguments["b"])}]}
        return JSONResponse({"jsonrpc": "2.0", "id": mid, "result": result})


async def test_an_http_server_that_lost_its_sessions_is_reconnected_at_once() -> None:
    """Every call was refused (error -32001) until the next poll, 30 s later."""
    async with StatefulHttpMcp() as web:
        toml = f'[[mcp]]\nname = "old"\nurl = "http://127.0.0.1:{web.port}/mcp"\n'
        async with started(toml) as tools:  # FAST: polls every 30 s
            first = await tools.invoke("old__add", {"a": 1, "b": 1}, tool_context())
            assert first.output == "2"
            web.forget()
            refused = await tools.invoke("old__add", {"a": 2, "b": 2}, tool_context())
            assert refused.error == {"code": "tool_error",
                                     "message": "MCP server old refused the call (error -32001)"}
            async with asyncio.timeout(5):  # the relist gap is 1 s
                while True:
                    again = await tools.invoke("old__add", {"a": 3, "b": 3}, tool_context())
                    if again.status == "ok":
                        break
                    await asyncio.sleep(0.2)
            assert again.output == "6"


async def test_an_unchanged_listing_is_not_checked_again(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Every listing (each poll, each list_changed) checked every schema against the
    metaschema on the event loop: 500 tools held it 2 s each time."""
    converted: list[int] = []
    convert = mcp_results.convert_listing

    def counted(*args: Any) -> Any:
        converted.append(1)
        return convert(*args)

    monkeypatch.setattr(mcp_source, "convert_listing", counted)
    log = tmp_path / "raw.log"
    timings = McpTimings(retry_min_s=0.05, poll_s=30, relist_gap_s=0.05)
    env = {"RAW_LOG": str(log), "RAW_TOOLS_N": "50", "RAW_NOTIFY_S": "0.05"}
    async with started(raw_toml(env=env), timings) as tools:
        async with asyncio.timeout(10):
            while log.read_text().count("list") < 6:  # noqa: ASYNC110 - another process
                await asyncio.sleep(0.05)
        assert available(tools)["raw__t49"]
    assert len(converted) == 1


def test_a_schema_is_judged_once(monkeypatch: pytest.MonkeyPatch) -> None:
    judged: list[dict[str, Any]] = []
    judge = mcp_results._judge_schema

    def counted(schema: dict[str, Any]) -> str | None:
        judged.append(schema)
        return judge(schema)

    monkeypatch.setattr(mcp_results, "_judge_schema", counted)
    config = parse_config(tomllib.loads(raw_toml())).mcp[0]
    schema = {"type": "object", "properties": {"n": {"type": "integer",
                                                     "maximum": time.time_ns()}}}
    listing = [mcp_types.Tool(name="x", input_schema=schema)]
    assert mcp_results.convert_listing(config, listing)[0].problem is None
    assert mcp_results.convert_listing(config, listing)[0].problem is None
    assert len(judged) == 1


DRAFT_07_TUPLE = {
    "$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
    "properties": {"xy": {"type": "array", "items": [{"type": "number"}, {"type": "number"}],
                          "minItems": 2, "maxItems": 2}},
    "required": ["xy"], "additionalProperties": False}


async def test_a_draft_07_schema_is_read_as_draft_07() -> None:
    """Its tuple `items` (what zod-to-json-schema emits) is invalid 2020-12: the tool
    was unavailable, and a client tool with such a schema refused the run."""
    extra = orjson.dumps({"name": "point", "inputSchema": DRAFT_07_TUPLE}).decode()
    async with started(raw_toml(env={"RAW_EXTRA_TOOL": extra})) as tools:
        [point] = [e for e in tools.describe() if e["name"] == "raw__point"]
        assert point["available"], point
        assert tools.check("raw__point", {"xy": [1, 2]}) == {"xy": [1, 2]}
        assert tools.check("raw__point", {"xy": [1, "b"]}) == (
            "invalid arguments for raw__point at xy/1: 'b' is not of type 'number'")
    client_tool = ToolSpec(name="point", description="", parameters=DRAFT_07_TUPLE)
    assert check_tool_schemas([client_tool]) is None


@pytest.mark.parametrize(("toml", "problem"), [
    ('[[workflows]]\nname = "w"\nmax_steps = 18446744073709551616\n',
     "workflows[0].max_steps: Input should be less than or equal to 1000000"),
    ('[[tools]]\nimport = "a:b"\ntimeout_s = inf\n',
     "tools[0].timeout_s: Input should be a finite number"),
    ('[[mcp]]\nname = "m"\ncommand = ["m"]\ntimeout_s = 1e300\n',
     "mcp[0].timeout_s: Input should be less than or equal to 31536000"),
])
def test_config_values_past_any_sense_are_refused(toml: str, problem: str) -> None:
    """A workflow's max_steps over 64 bits started, then every checkpoint was skipped."""
    with pytest.raises(ConfigError) as refused:
        parse_config(tomllib.loads(toml))
    assert str(refused.value) == f"COWRITE_CONFIG: {problem}"


async def test_a_helper_the_server_started_ends_with_it(tmp_path: Path) -> None:
    """A server that exits on its own when its stdin closes left the processes it had
    started (same process group) running, at every restart and shutdown: the group
    was signalled only when the server itself outlived the grace."""
    pid_file = tmp_path / "helper.pid"
    async with started(raw_toml("raw", {"RAW_HELPER": str(pid_file)})) as tools:
        assert available(tools)["raw__echo"]
        helper = int(pid_file.read_text())
    for _ in range(50):  # reaped by its parent's exit: gone, or a zombie of init
        if _process_state(helper) in (None, "Z"):
            break
        await asyncio.sleep(0.1)
    else:
        os.kill(helper, 9)
        raise AssertionError("the helper the MCP server started is still running")


def _process_state(pid: int) -> str | None:
    """The state letter of `pid` in /proc (None: no such process)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None

