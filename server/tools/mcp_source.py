"""One MCP server, kept connected in the background through the official `mcp` SDK.

A supervisor task owns the SDK `Client` (its anyio task group must be entered
and left by one task) and loops: connect, list the tools, watch, and when the
connection is lost, reconnect with exponential backoff and jitter. A crash of
the server therefore never reaches cowrite: calls made while it is down fail
fast with ToolUnavailable (a tool error for the model), and its tools come
back when it does.

Watching: `notifications/tools/list_changed` triggers a new listing. On a
2026-07-28 connection the server only sends it on a `subscriptions/listen`
stream, which we keep open (its abrupt end also tells us the connection is
gone); on older connections it arrives through the message handler. Every
`poll_s` the tools are listed again anyway, which doubles as a liveness probe
for servers that offer neither.

Cancellation: the caller's task runs `call_tool` itself, so cancelling it
cancels the SDK request, which sends `notifications/cancelled` to the server.
"""

import asyncio
import contextlib
import logging
import math
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import anyio
import mcp.types as mcp_types
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.client.subscriptions import ListenNotSupportedError, SubscriptionLost
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError
from mcp.types.version import MODERN_PROTOCOL_VERSIONS

from server.tools.config import McpServerConfig
from server.tools.context import ToolError, ToolUnavailable
from server.tools.mcp_failures import CONNECTION_ERRORS, Failure, check_cwd, describe_failure
from server.tools.mcp_results import McpTool, convert_listing, tool_output, unknown_names
from server.tools.mcp_stdio import StdioState, stdio_transport

log = logging.getLogger("cowrite.tools.mcp")

_CLOSE_S = 10.0  # how long close() lets the SDK shut a connection down
# The SDK's stdio shutdown: stdin closed, 2 s to exit, SIGTERM, 2 s more, SIGKILL.
_TEARDOWN_S = 5.0


@dataclass(frozen=True)
class McpTimings:
    """Reconnect and probe timings (COWRITE_MCP_* settings)."""

    connect_timeout_s: float = 10.0
    retry_min_s: float = 0.5
    retry_max_s: float = 30.0
    poll_s: float = 30.0
    relist_gap_s: float = 1.0  # at most one listing per gap, however often changes come


class McpConnection:
    """The live state of one `[[mcp]]` server: its tools, whether it is up, why not."""

    def __init__(self, config: McpServerConfig, timings: McpTimings,
                 max_line_bytes: int = 2 * 1_048_576) -> None:
        self.config = config
        self.max_line_bytes = max_line_bytes  # of a stdio server's stdout
        self.name = config.name
        self.timings = timings
        self.tools: list[McpTool] = []
        self.problem: str | None = "not started"
        self.ever_up = False
        self.version = 0  # bumped on every change of up/problem/tools
        self._client: Client | None = None
        self._wake = asyncio.Event()
        self._lost = False
        self._connected = False
        self._attempted = asyncio.Event()
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._scope: anyio.CancelScope | None = None  # the supervisor's: how close() stops it
        self._closing = False
        self._last_failure: str | None = None  # the reason last logged (see `_log_down`)
        self._unknown_warned: set[str] = set()  # allowlist and rename typos, warned once
        self._stdio: StdioState | None = None  # the current stdio connection's transport
        self._listed: list[mcp_types.Tool] | None = None  # the last listing, as received

    @property
    def up(self) -> bool:
        return self._client is not None

    async def wait_changed(self) -> None:
        """Return at the next change of `up`, `problem` or `tools`."""
        await self._changed.wait()

    def _notify(self) -> None:
        self.version += 1
        self._changed.set()
        self._changed = asyncio.Event()

    async def start(self) -> None:
        """Begin connecting; return after the first attempt (bounded by the connect timeout
        and the time the SDK takes to stop a server that did not answer in it)."""
        self._task = asyncio.create_task(self._supervise(), name=f"mcp:{self.name}")
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.timings.connect_timeout_s + _TEARDOWN_S):
                await self._attempted.wait()

    async def close(self) -> None:
        """Stop the supervisor, in bounded time.

        One cancellation of the supervisor's anyio cancel scope, then up to `_CLOSE_S`
        for the SDK to shut the connection down (a stdio server gets its stdin closed,
        time to exit, then a signal). The SDK shields that shutdown from anyio's
        cancellation but not from a native `Task.cancel()` (a second one here, or the
        connect timeout's when it was an `asyncio.timeout`), which cut it short and left
        a server that hung on `initialize` running after cowrite exited. The SDK's
        transports run anyio task groups, and a cancellation that lands while
        one of them is failing can come out as an ordinary exception, so the
        supervisor also stops on `_closing`. Only a connection that still has not
        ended is cancelled once more and then left, with a warning: a shutdown or a
        reload never waits on a server that will not let go.
        """
        task, self._task = self._task, None
        if task is None:
            return
        self._closing = True
        self._wake.set()
        if self._scope is not None:
            self._scope.cancel()
        else:
            task.cancel()  # it has not run yet
        for wait_s in (_CLOSE_S, 1.0):
            await asyncio.wait({task}, timeout=wait_s)
            if task.done():
                if not task.cancelled() and task.exception() is not None:
                    log.debug("mcp server %s: supervisor ended with %r", self.name,
                              task.exception())
                return
            task.cancel()
        log.warning("mcp server %s: its connection did not close in %g s; left behind",
                    self.name, _CLOSE_S + 1.0)

    async def call(self, mcp_name: str, arguments: dict[str, Any]) -> Any:
        """Call one tool; ToolUnavailable when the server is down, ToolError when it says no."""
        client, stdio = self._client, self._stdio
        if client is None:
            raise ToolUnavailable(f"MCP server {self.name} is not reachable right now; "
                                  "try again later")
        try:
            result = await client.call_tool(mcp_name, arguments)
        except MCPError as exc:
            if _closed(exc):
                self._connection_lost(client)
                raise ToolUnavailable(self._gone(stdio)) from exc
            log.warning("mcp server %s refused %s: %s", self.name, mcp_name, exc.error.message)
            # A server that restarted and lost its HTTP sessions refuses every call
            # (-32600, -32001): relist now, which reconnects when the listing fails too,
            # rather than at the next poll (at most one listing per `relist_gap_s`).
            self._wake.set()
            raise ToolError(f"MCP server {self.name} refused the call (error {exc.code})") from exc
        except CONNECTION_ERRORS as exc:
            self._connection_lost(client)
            raise ToolUnavailable(self._gone(stdio)) from exc
        return tool_output(result)

    def _gone(self, stdio: StdioState | None) -> str:
        if stdio is not None and stdio.oversized:
            return (f"MCP server {self.name} sent a message over {stdio.max_line_bytes} bytes; "
                    "it is being restarted")
        return f"MCP server {self.name} went away during the call"

    # The supervisor ---------------------------------------------------------

    def _connection_lost(self, client: Client) -> None:
        """Stop offering the tools at once; the supervisor then reconnects. Only for the
        current connection: a call begun on an earlier one can fail after the
        supervisor has connected again, and that new connection is fine."""
        if client is not self._client:
            return
        self._lost = True
        self._wake.set()
        self._client = None
        self.problem = f"MCP server {self.name} is down (connection lost); restarting"
        self._notify()

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, mcp_types.ToolListChangedNotification):
            self._wake.set()
        elif isinstance(message, Exception):
            log.debug("mcp server %s transport: %r", self.name, message)

    def _log_down(self, failure: Failure, exc: Exception | None) -> Failure:
        """One line per failure, naming what to fix; a traceback only for a failure
        nobody expects, and a failure like the last one at debug level (a missing
        command printed a 50-line traceback every retry, for ever). A server that was
        up and went down is always a warning (a crash was restarted without a word).
        A stdio server's last stderr lines follow, at the same level."""
        failure = self._stdio_failure(failure)
        repeated = failure.logged == self._last_failure
        self._last_failure = failure.logged
        level = logging.DEBUG if repeated else logging.WARNING
        log.log(level, "mcp server %s %s: %s; restarting in the background", self.name,
                "went down" if self._connected else "is down", failure.logged,
                exc_info=None if failure.expected or repeated else exc)
        tail = list(self._stdio.stderr_tail) if self._stdio is not None else []
        if tail:
            log.log(level, "mcp server %s: the last %d lines of its stderr: %s", self.name,
                    len(tail), " | ".join(line.strip() for line in tail))
        return failure

    def _stdio_failure(self, failure: Failure) -> Failure:
        """A stdio server's own account of its end, when it has one: a process that
        exited before the handshake, with its last stderr line (a missing module, a
        bad flag), or a message over the line limit. A crash of a server that was up
        keeps its usual line; its stderr follows it."""
        stdio = self._stdio
        if stdio is None:
            return failure
        if stdio.oversized:
            too_big = f"it sent a message over {stdio.max_line_bytes} bytes"
            return Failure(too_big, f"{too_big} (twice COWRITE_MAX_MESSAGE_BYTES)")
        code = stdio.exit_code
        if code is None or self._connected:
            return failure
        ended = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        last = stdio.stderr_tail[-1] if stdio.stderr_tail else None
        said = f"its last stderr line: {last!r}" if last else "it wrote nothing to stderr"
        return Failure(f"its process {ended}",
                       f"process {ended} before the handshake; {said}")

    async def _supervise(self) -> None:
        with anyio.CancelScope() as self._scope:
            await self._reconnect_forever()

    async def _reconnect_forever(self) -> None:
        delay = self.timings.retry_min_s
        while not self._closing:
            reason = "connection lost"
            self._connected = False
            try:
                await self._session()
            except Exception as exc:  # any failure of the server: restart, never crash
                if self._closing:
                    return  # a cancellation the transport turned into an error
                reason = self._log_down(describe_failure(exc, self.config), exc).problem
            else:  # it was up, and the connection was lost (a crash, an abrupt end)
                if self._closing:
                    return
                reason = self._log_down(Failure(reason, reason), None).problem
            if self._connected:
                delay = self.timings.retry_min_s  # it worked: start the backoff over
            self._client = None
            self.problem = f"MCP server {self.name} is down ({reason}); restarting"
            self._attempted.set()
            self._notify()
            await asyncio.sleep(delay * random.uniform(0.8, 1.2))
            delay = min(delay * 2, self.timings.retry_max_s)

    @contextlib.asynccontextmanager
    async def _connect(self) -> AsyncIterator[Client]:
        info = mcp_types.Implementation(name="cowrite", version="1.1")
        async with contextlib.AsyncExitStack() as stack:
            if self.config.url is not None:
                http = await stack.enter_async_context(
                    create_mcp_http_client(headers=self.config.headers))
                client = Client(streamable_http_client(self.config.url, http_client=http),
                                message_handler=self._on_message, client_info=info)
            else:
                check_cwd(self.config)
                command = self.config.command or []
                params = StdioServerParameters(
                    command=command[0], args=command[1:], env=self.config.env,
                    cwd=self.config.cwd)
                self._stdio = StdioState(self.max_line_bytes)
                transport = stdio_transport(params, self._stdio, self.name, self._wake.set)
                client = Client(transport, message_handler=self._on_message, client_info=info)
            yield await stack.enter_async_context(client)

    async def _session(self) -> None:
        """One connection, from connecting to its loss. The connect timeout is the
        deadline of an anyio scope around the whole session, lifted once connected: an
        anyio cancel respects the SDK's shielded shutdown, where the native cancel of an
        `asyncio.timeout` cut it short (a close() within 2 s of the timeout left the
        server running), and the scope must enclose the Client's own scopes."""
        self._lost = False
        self._wake.clear()
        self._stdio = self._listed = None
        connecting = anyio.CancelScope(
            deadline=anyio.current_time() + self.timings.connect_timeout_s)
        try:
            with connecting:
                async with self._connect() as client:
                    await self._list_tools(client)
                    connecting.deadline = math.inf
                    await self._serve(client)
        except Exception as exc:  # the transport may turn the deadline's cancel into this
            if connecting.cancel_called and not self._connected:
                raise TimeoutError from exc
            raise
        if connecting.cancelled_caught:
            raise TimeoutError

    async def _serve(self, client: Client) -> None:
        self._client, self.problem, self.ever_up = client, None, True
        self._connected, self._last_failure = True, None
        self._attempted.set()
        self._notify()
        log.info("mcp server %s is up with %d tools", self.name, len(self.tools))
        async with anyio.create_task_group() as group:
            if client.protocol_version in MODERN_PROTOCOL_VERSIONS:
                group.start_soon(self._listen, client)
            await self._watch(client)
            group.cancel_scope.cancel()

    async def _watch(self, client: Client) -> None:
        """Relist on change notifications and every poll_s; return when the connection is
        lost. Changes announced within `relist_gap_s` of the last listing wait for the
        gap to end and make one listing: a server that announces a change after every
        listing (seen: 1,760 listings a second, a whole core) costs one per gap."""
        listed_at = -self.timings.relist_gap_s
        while True:
            with anyio.move_on_after(self.timings.poll_s):
                await self._wake.wait()
            if self._lost or self._closing:
                return
            pause = listed_at + self.timings.relist_gap_s - anyio.current_time()
            if pause > 0:
                await anyio.sleep(pause)
                if self._lost or self._closing:
                    return
            self._wake.clear()
            with anyio.fail_after(self.timings.connect_timeout_s):
                await self._list_tools(client)
            listed_at = anyio.current_time()

    async def _listen(self, client: Client) -> None:
        while True:
            try:
                async with client.listen(tools_list_changed=True) as subscription:
                    async for _event in subscription:
                        self._wake.set()
            except (ListenNotSupportedError, MCPError):
                return  # the server offers no listen stream: polling only
            except SubscriptionLost:
                self._connection_lost(client)
                return
            self._wake.set()  # a graceful end: relist (a probe), then listen again
            await anyio.sleep(self.timings.retry_min_s)

    async def _list_tools(self, client: Client) -> None:
        listed: list[mcp_types.Tool] = []
        cursor: str | None = None
        for _ in range(100):
            page = await client.list_tools(cursor=cursor, cache_mode="refresh")
            listed.extend(page.tools)
            cursor = page.next_cursor
            if cursor is None:
                break
        if listed == self._listed:
            return  # the usual poll: nothing to check again (500 tools took 2 s)
        self._listed = listed
        unknown = [name for name in unknown_names(self.config, listed)
                   if name not in self._unknown_warned]
        if unknown:
            self._unknown_warned.update(unknown)
            log.warning("mcp server %s lists no tool named %s; check the spelling in its "
                        "config", self.name, ", ".join(unknown))
        tools = convert_listing(self.config, listed)
        if tools != self.tools:
            self.tools = tools
            self._notify()


def _closed(exc: MCPError) -> bool:
    """Whether the SDK raised `exc` because the connection closed. Its code for that,
    -32000 (`CONNECTION_CLOSED`), is also the usual JSON-RPC code of a server's own
    failures: those were taken for a lost connection, the server restarted and its
    tools gone for the next call. The SDK's own error has exactly this message."""
    return exc.code == mcp_types.CONNECTION_CLOSED and exc.error.message == "Connection closed" \
        and exc.error.data is None
