"""MCP servers through the official SDK: a real MCPServer over stdio (a subprocess)
and over streamable HTTP (uvicorn on a free port), both started by the tests."""

import asyncio
import contextlib
import itertools
import logging
import os
import re
import signal
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
import uvicorn
from starlette.types import Receive, Scope, Send

from server.tools.config import McpServerConfig
from server.tools.context import ToolUnavailable
from server.tools.mcp_source import McpConnection, McpTimings
from tests.harness import free_port
from tests.log_records import records_of
from tests.mcp_fixture_server import build
from tests.tool_support import (
    available,
    file_says,
    started_catalog,
    tool_context,
    until,
)

ROOT = Path(__file__).resolve().parent.parent
STDIO = f"""
[[mcp]]
name = "fx"
command = [{orjson.dumps(sys.executable).decode()}, "-m", "tests.mcp_fixture_server"]
cwd = {orjson.dumps(str(ROOT)).decode()}
"""


started = started_catalog  # with FAST timings


async def test_stdio_listing_calls_and_result_mapping() -> None:
    async with started(STDIO) as tools:
        described = {e["name"]: e for e in tools.describe() if e["source"] == "mcp:fx"}
        assert set(described) == {"fx__add", "fx__shout", "fx__pid", "fx__slow", "fx__refuse",
                                  "fx__dotted_name", "fx__grow", "fx__storm"}
        add = described["fx__add"]
        assert add["available"] and add["requires_approval"]  # MCP default: approval
        assert add["description"] == "Add two integers."
        assert add["parameters"]["required"] == ["a", "b"]
        assert tools.check("fx__add", {"a": 1, "b": "two"}) == (
            "invalid arguments for fx__add at b: 'two' is not of type 'integer'")
        ctx = tool_context()
        structured = await tools.invoke("fx__add", {"a": 2, "b": 3}, ctx)
        assert (structured.status, structured.output) == ("ok", {"result": 5})
        text = await tools.invoke("fx__shout", {"text": "hi"}, ctx)
        assert (text.status, text.output) == ("ok", "HI")
        dotted = await tools.invoke("fx__dotted_name", {}, ctx)
        assert dotted.output == {"result": "dotted"}
        refused = await tools.invoke("fx__refuse", {}, ctx)
        assert refused.status == "error"
        assert refused.error == {"message": "Error executing tool refuse: the fixture refuses",
                                 "code": "tool_error"}


async def test_allowlist_rename_and_approval_from_the_config() -> None:
    config = STDIO + 'requires_approval = false\ntools = ["add", "shout"]\n' \
                     'rename = { shout = "yell" }\ntimeout_s = 7\n'
    async with started(config) as tools:
        specs = {s.name: s for s in tools.specs()}
        assert set(specs) == {"text_stats", "fx__add", "yell"}
        assert not specs["yell"].requires_approval and specs["yell"].timeout_s == 7
        yelled = await tools.invoke("yell", {"text": "quiet"}, tool_context())
        assert yelled.output == "QUIET"
        blocked = await tools.invoke("fx__pid", {}, tool_context())
        assert blocked.error == {"message": "unknown server tool 'fx__pid'",
                                 "code": "unavailable"}


async def test_cancelling_the_caller_cancels_the_mcp_call(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    async with started(STDIO) as tools:
        call = asyncio.create_task(tools.invoke(
            "fx__slow", {"key": "k1", "seconds": 30, "log": str(log)}, tool_context()))
        await file_says(log, "started k1")
        call.cancel()
        await asyncio.gather(call, return_exceptions=True)
        assert call.cancelled()
        await file_says(log, "cancelled k1")  # notifications/cancelled reached the server
        after = await tools.invoke("fx__add", {"a": 1, "b": 1}, tool_context())
        assert after.output == {"result": 2}  # the connection is still good


async def test_timeout_ends_the_call_and_the_server_sees_the_cancellation(tmp_path: Path
                                                                           ) -> None:
    log = tmp_path / "server.log"
    async with started(STDIO + "timeout_s = 0.5\n") as tools:
        result = await tools.invoke("fx__slow", {"key": "k2", "seconds": 30, "log": str(log)},
                                    tool_context())
        assert result.status == "timeout"
        assert result.error == {"message": "fx__slow took longer than 0.5 s", "code": "timeout"}
        await file_says(log, "cancelled k2")


async def test_server_killed_mid_call_gives_a_tool_error_and_comes_back(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    async with started(STDIO) as tools:
        ctx = tool_context()
        first_pid = (await tools.invoke("fx__pid", {}, ctx)).output["result"]
        call = asyncio.create_task(tools.invoke(
            "fx__slow", {"key": "k3", "seconds": 30, "log": str(log)}, ctx))
        await file_says(log, "started k3")
        os.kill(first_pid, signal.SIGKILL)
        result = await asyncio.wait_for(call, 10)
        assert result.status == "error"
        assert result.error == {"message": "MCP server fx went away during the call",
                                "code": "unavailable"}
        await until(tools, lambda: available(tools).get("fx__pid") is True)
        second_pid = (await tools.invoke("fx__pid", {}, ctx)).output["result"]
        assert second_pid != first_pid


async def test_tool_list_changed_refreshes_the_listing() -> None:
    async with started(STDIO) as tools:
        assert "fx__extra" not in available(tools)
        grown = await tools.invoke("fx__grow", {}, tool_context())
        assert grown.output == {"result": "grown"}
        await until(tools, lambda: available(tools).get("fx__extra") is True)
        extra = await tools.invoke("fx__extra", {}, tool_context())
        assert extra.output == {"result": "extra!"}


async def test_a_storm_of_change_notices_costs_one_listing_per_gap(
        monkeypatch: pytest.MonkeyPatch) -> None:
    listings: list[float] = []
    real = McpConnection._list_tools

    async def counted(self: McpConnection, client: Any) -> None:
        listings.append(asyncio.get_running_loop().time())
        await real(self, client)

    monkeypatch.setattr(McpConnection, "_list_tools", counted)
    async with started(STDIO) as tools:
        before = len(listings)
        calm = await tools.invoke("fx__storm", {"times": 40, "every_s": 0.02}, tool_context())
        assert calm.output == {"result": "calm"}
        await asyncio.sleep(1.2)  # the gap after the storm's last notice
        during = listings[before:]
    # 40 notices over 0.8 s: without the gap, about one listing each
    assert 1 <= len(during) <= 3, len(during)
    assert all(b - a >= 0.95 for a, b in itertools.pairwise(during))


async def test_server_that_cannot_start_is_reported_and_calls_fail_cleanly() -> None:
    config = '[[mcp]]\nname = "ghost"\ncommand = ["/nonexistent/ghost-mcp"]\n' \
             '[[mcp]]\nname = "listed"\ncommand = ["/nonexistent/ghost-mcp"]\ntools = ["a.b"]\n'
    async with started(config) as tools:
        described = {e["name"]: e for e in tools.describe()}
        assert described["text_stats"]["available"]
        ghost = described["ghost__*"]
        assert not ghost["available"] and ghost["source"] == "mcp:ghost"
        assert ghost["problem"] == ("MCP server ghost is down (its command cannot be started); "
                                    "restarting")
        assert not described["listed__a_b"]["available"]
        result = await tools.invoke("listed__a_b", {}, tool_context())
        assert result.status == "error" and result.error is not None
        assert result.error["code"] == "unavailable"
        assert "/nonexistent" not in result.error["message"]


async def test_a_missing_command_is_one_warning_naming_it_then_quiet() -> None:
    """It printed a 50-line traceback on every retry, without naming the command."""
    with records_of("cowrite.tools") as records:
        fast = McpTimings(retry_min_s=0.05, retry_max_s=0.05)
        ghost = '[[mcp]]\nname = "ghost"\ncommand = ["/nonexistent/ghost-mcp"]\n'
        async with started_catalog(ghost, fast):
            await asyncio.sleep(0.6)  # several retries
    down = [r for r in records if "mcp server ghost is down" in r.getMessage()]
    assert len(down) >= 3
    assert [r.levelno for r in down][:2] == [logging.WARNING, logging.DEBUG]
    assert "(command '/nonexistent/ghost-mcp')" in down[0].getMessage()
    assert all(r.exc_info is None for r in down)


async def test_closing_never_waits_on_a_transport_that_swallows_the_cancellation() -> None:
    """The SDK's transports run anyio task groups; a cancellation that lands while one
    is torn down can surface as a connection error instead. Closing still ends."""
    connection = McpConnection(McpServerConfig(name="stuck", url="http://127.0.0.1:9/mcp"),
                               McpTimings(connect_timeout_s=0.2, retry_min_s=0.01))
    connecting = asyncio.Event()

    @contextlib.asynccontextmanager
    async def transport_that_hides_cancellation() -> AsyncIterator[Any]:
        connecting.set()
        try:
            await asyncio.Event().wait()  # connects forever
        except asyncio.CancelledError:
            raise anyio.ClosedResourceError from None
        yield None  # pragma: no cover

    connection._connect = transport_that_hides_cancellation  # type: ignore[method-assign]
    await connection.start()  # the first attempt timed out: down, retrying
    assert not connection.up and connection.problem is not None
    connecting.clear()
    await asyncio.wait_for(connecting.wait(), 5)  # now inside a connection attempt
    supervisor = connection._task
    assert supervisor is not None
    async with asyncio.timeout(2) as deadline:
        await connection.close()
    assert not deadline.expired()  # the first cancellation was enough
    assert supervisor.done()  # nothing left reconnecting behind the caller's back


HANGS_ON_INITIALIZE = ("import os, sys, time\n"
                      "open(sys.argv[1], 'a').write(f'{os.getpid()}\\n')\n"
                      "time.sleep(3600)  # never answers initialize, ignores stdin closing\n")


async def _eventually(predicate: Callable[[], bool], timeout_s: float) -> None:
    async with asyncio.timeout(timeout_s):
        while not predicate():  # noqa: ASYNC110 - files and processes have no events
            await asyncio.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("when", ["while it hangs", "after the attempt timed out"])
async def test_a_server_hanging_on_initialize_is_stopped_not_left_running(
        tmp_path: Path, when: str) -> None:
    """Closing cancelled the supervisor natively, which cut the SDK's shielded shutdown
    (stdin closed, then SIGTERM) short: cowrite's shutdown waited 11 s and the server
    process outlived it."""
    pids = tmp_path / "pids"
    command = [sys.executable, "-c", HANGS_ON_INITIALIZE, str(pids)]
    config = McpServerConfig(name="mute", command=command)
    timeout_s = 30.0 if when == "while it hangs" else 0.5
    connection = McpConnection(config, McpTimings(connect_timeout_s=timeout_s,
                                                  retry_min_s=30, retry_max_s=30))
    starting = asyncio.create_task(connection.start())
    await _eventually(lambda: pids.exists() and pids.read_text().endswith("\n"), 10)
    if when == "after the attempt timed out":
        await asyncio.wait_for(starting, 10)
        assert not connection.up and connection.problem is not None
        assert "no answer in time" in connection.problem
    async with asyncio.timeout(8) as deadline:
        await connection.close()
    assert not deadline.expired()
    pid = int(pids.read_text().split()[0])
    await _eventually(lambda: not _alive(pid), 5)
    starting.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await starting



@pytest.mark.parametrize("close_after_s", [0.5, 1.3, 2.5])
async def test_closing_near_the_connect_timeout_still_stops_the_server(
        tmp_path: Path, close_after_s: float) -> None:
    """The connect timeout was an asyncio.timeout: when it fired while close() had the
    SDK shutting the server down (stdin closed, 2 s, SIGTERM), its native cancel cut that
    shielded shutdown short; close() then took 11 s and the server outlived cowrite. The
    timeout here is 1.5 s, so closing at 0.5 s and 1.3 s lands in that window, and at
    2.5 s during the SDK's own shutdown of the timed-out attempt."""
    pids = tmp_path / "pids"
    command = [sys.executable, "-c", HANGS_ON_INITIALIZE, str(pids)]
    connection = McpConnection(McpServerConfig(name="mute", command=command),
                               McpTimings(connect_timeout_s=1.5, retry_min_s=30,
                                          retry_max_s=30))
    starting = asyncio.create_task(connection.start())
    await _eventually(lambda: pids.exists() and pids.read_text().endswith("\n"), 10)
    await asyncio.sleep(close_after_s)
    began = asyncio.get_running_loop().time()
    await asyncio.wait_for(connection.close(), 15)
    took = asyncio.get_running_loop().time() - began
    assert took < 3.5, took  # the SDK's shutdown: 2 s of grace, then SIGTERM
    pid = int(pids.read_text().split()[0])
    assert not _alive(pid)
    await asyncio.wait_for(starting, 5)



def mcp_log() -> contextlib.AbstractContextManager[list[logging.LogRecord]]:
    """The records of cowrite.tools.mcp, debug level included."""
    return records_of("cowrite.tools.mcp")


def warnings_of(records: list[logging.LogRecord]) -> list[str]:
    return [r.getMessage() for r in records if r.levelno >= logging.WARNING]


async def test_a_missing_cwd_is_named_not_blamed_on_the_command(tmp_path: Path) -> None:
    """The spawn's FileNotFoundError was reported as "its command cannot be started"."""
    missing = tmp_path / "gone"
    config = STDIO.replace(orjson.dumps(str(ROOT)).decode(), orjson.dumps(str(missing)).decode())
    with mcp_log() as records:
        async with started(config) as tools:
            problem = {e["name"]: e for e in tools.describe()}["fx__*"]["problem"]
    assert problem == "MCP server fx is down (its working directory does not exist); restarting"
    assert warnings_of(records)[0] == (
        f"mcp server fx is down: its working directory does not exist (cwd '{missing}'); "
        "restarting in the background")


async def test_an_unreachable_http_server_is_one_line_naming_the_url() -> None:
    """httpx's ConnectError was no connection error: an 80-line traceback."""
    url = f"http://127.0.0.1:{free_port()}/mcp"
    with mcp_log() as records:
        async with started(f'[[mcp]]\nname = "web"\nurl = "{url}"\n') as tools:
            problem = {e["name"]: e for e in tools.describe()}["web__*"]["problem"]
    assert problem == "MCP server web is down (cannot connect: connection refused); restarting"
    down = [r for r in records if r.levelno == logging.WARNING]
    assert [r.getMessage() for r in down] == [
        f"mcp server web is down: cannot connect to {url}: connection refused; "
        "restarting in the background"]
    assert down[0].exc_info is None


async def test_a_wrong_url_path_is_reported_as_a_404() -> None:
    """It was reported as "MCP error -32601" (the SDK's stand-in for the 404)."""
    server = HttpMcp(free_port())
    await server.start()
    url = f"http://127.0.0.1:{server.port}/wrong"
    try:
        with mcp_log() as records:
            async with started(f'[[mcp]]\nname = "web"\nurl = "{url}"\n') as tools:
                problem = {e["name"]: e for e in tools.describe()}["web__*"]["problem"]
    finally:
        await server.stop()
    assert problem == "MCP server web is down (its URL answered 404 Not Found); restarting"
    assert warnings_of(records)[0] == (
        f"mcp server web is down: {url} answered 404 Not Found (is the path right?); "
        "restarting in the background")


async def test_a_crashed_server_is_one_warning_then_restarted() -> None:
    """It was restarted without a word in the log."""
    timings = McpTimings(connect_timeout_s=10, retry_min_s=0.05, retry_max_s=0.5, poll_s=1.0)
    with mcp_log() as records:
        async with started_catalog(STDIO, timings) as tools:
            assert warnings_of(records) == []
            pid = (await tools.invoke("fx__pid", {}, tool_context())).output["result"]
            os.kill(pid, signal.SIGKILL)
            await _eventually(lambda: bool(warnings_of(records)), 10)
            await until(tools, lambda: available(tools).get("fx__pid") is True)
            again = await tools.invoke("fx__pid", {}, tool_context())
            assert again.output["result"] != pid
    [warning] = warnings_of(records)  # noticed by the listen stream or by a listing
    assert re.fullmatch(r"mcp server fx went down: connection (lost|closed); restarting in "
                        r"the background", warning), warning



async def test_a_typo_in_the_allowlist_or_rename_is_a_warning_once() -> None:
    """A name the server does not list was ignored without a word."""
    config = STDIO + 'tools = ["add", "ad"]\nrename = { add = "plus", shuot = "yell" }\n'
    timings = McpTimings(connect_timeout_s=10, retry_min_s=0.05, poll_s=0.2, relist_gap_s=0.1)
    with mcp_log() as records:
        async with started_catalog(config, timings) as tools:
            assert available(tools)["plus"] is True
            await asyncio.sleep(0.6)  # more listings: no more warnings
    assert warnings_of(records) == [
        "mcp server fx lists no tool named 'ad' (tools), 'shuot' (rename); check the "
        "spelling in its config"]


# Streamable HTTP ---------------------------------------------------------------


class HttpMcp:
    """The fixture MCPServer served by uvicorn on `port`; records Authorization headers."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.authorization: list[str] = []
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        inner = build().streamable_http_app()

        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http":
                headers: dict[bytes, bytes] = dict(scope["headers"])
                self.authorization.append(headers.get(b"authorization", b"").decode())
            await inner(scope, receive, send)

        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                lifespan="on", timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        self._task = asyncio.create_task(self._server.serve())
        async with asyncio.timeout(20):
            while not self._server.started:
                assert not self._task.done(), "MCP HTTP server did not start"
                await asyncio.sleep(0.01)

    async def stop(self) -> None:
        assert self._server is not None and self._task is not None
        self._server.should_exit = True
        await asyncio.wait_for(self._task, 10)


def http_config(port: int, extra: str = "") -> str:
    return (f'[[mcp]]\nname = "web"\nurl = "http://127.0.0.1:{port}/mcp"\n'
            f'headers = {{ Authorization = "Bearer mcp-secret" }}\n{extra}')


async def test_http_listing_calls_headers_and_cancellation(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    server = HttpMcp(free_port())
    await server.start()
    try:
        async with started(http_config(server.port)) as tools:
            assert available(tools)["web__add"] is True
            added = await tools.invoke("web__add", {"a": 20, "b": 22}, tool_context())
            assert added.output == {"result": 42}
            assert server.authorization and set(server.authorization) == {"Bearer mcp-secret"}
            call = asyncio.create_task(tools.invoke(
                "web__slow", {"key": "h1", "seconds": 30, "log": str(log)}, tool_context()))
            await file_says(log, "started h1")
            call.cancel()
            await asyncio.gather(call, return_exceptions=True)
            await file_says(log, "cancelled h1")
    finally:
        await server.stop()


async def test_http_server_down_then_back(tmp_path: Path) -> None:
    port = free_port()
    server = HttpMcp(port)
    await server.start()
    async with started(http_config(port)) as tools:
        assert available(tools)["web__add"] is True
        await server.stop()
        down: Any = await tools.invoke("web__add", {"a": 1, "b": 2}, tool_context())
        assert down.status == "error" and down.error["code"] == "unavailable"
        assert down.error["message"].startswith("MCP server web ")
        await until(tools, lambda: available(tools)["web__add"] is False)
        assert tools.spec("web__add") is None
        server = HttpMcp(port)
        await server.start()
        try:
            await until(tools, lambda: available(tools)["web__add"] is True)
            back = await tools.invoke("web__add", {"a": 1, "b": 2}, tool_context())
            assert back.output == {"result": 3}
        finally:
            await tools.close()
            await server.stop()


async def test_a_late_failure_of_a_call_on_an_old_connection_leaves_the_new_one_up() -> None:
    """A call begun on a connection the supervisor has since replaced fails late (its
    transport broke); it used to mark the *new*, healthy connection lost and restart
    the server. Only the old connection is a stand-in here: the new one is real."""
    async with started(STDIO) as tools:
        ctx = tool_context()
        pid = (await tools.invoke("fx__pid", {}, ctx)).output["result"]
        connection = tools._mcp[0]
        current = connection._client
        release = asyncio.Event()

        class ReplacedClient:
            async def call_tool(self, name: str, arguments: dict[str, Any]) -> Any:
                await release.wait()
                raise anyio.BrokenResourceError

        connection._client = ReplacedClient()  # type: ignore[assignment]
        late = asyncio.create_task(connection.call("pid", {}))
        await asyncio.sleep(0)  # the call took the old connection
        connection._client = current  # the supervisor connected again meanwhile
        release.set()
        with pytest.raises(ToolUnavailable):
            await late
        assert connection.up and connection.problem is None
        await asyncio.sleep(0.3)  # a restart, had one begun, would show here
        assert available(tools)["fx__pid"]
        assert (await tools.invoke("fx__pid", {}, ctx)).output["result"] == pid
