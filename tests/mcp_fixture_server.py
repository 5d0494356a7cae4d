"""An MCP server for the tests, written with the official SDK's MCPServer.

Run over stdio as `python -m tests.mcp_fixture_server`; the HTTP tests serve
`build().streamable_http_app()` with uvicorn in the test's own loop. `slow`
appends `started <key>` / `cancelled <key>` lines to the file it is given, so
a test can see the cancellation arrive on the server side.
"""

import asyncio
import os
from pathlib import Path

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError


def _note(log: str, line: str) -> None:
    with Path(log).open("a") as file:
        file.write(line + "\n")


def build() -> MCPServer:
    """A fresh server: `grow` changes its tool list, so tests do not share one."""
    mcp = MCPServer("fixture")

    @mcp.tool()
    async def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @mcp.tool(structured_output=False)
    async def shout(text: str) -> str:
        """Upper-case a text (unstructured: text content only)."""
        return text.upper()

    @mcp.tool()
    async def pid() -> int:
        """The server's process id (the tests kill it)."""
        return os.getpid()

    @mcp.tool()
    async def slow(key: str, seconds: float, log: str) -> str:
        """Sleep, noting start and cancellation in `log`."""
        _note(log, f"started {key}")
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            _note(log, f"cancelled {key}")
            raise
        _note(log, f"finished {key}")
        return "done"

    @mcp.tool()
    async def refuse() -> str:
        """Always an isError result."""
        raise ToolError("the fixture refuses")

    @mcp.tool(name="dotted.name")
    async def dotted() -> str:
        """A name with a dot, sanitized by cowrite."""
        return "dotted"

    @mcp.tool()
    async def grow(ctx: Context) -> str:
        """Add the tool `extra` and announce that the tool list changed."""

        async def extra() -> str:
            """Added at run time."""
            return "extra!"

        mcp.add_tool(extra)
        await ctx.notify_tools_changed()
        return "grown"

    @mcp.tool()
    async def storm(ctx: Context, times: int, every_s: float) -> str:
        """Announce a tool list change `times` times, `every_s` apart."""
        for _ in range(times):
            await ctx.notify_tools_changed()
            await asyncio.sleep(every_s)
        return "calm"

    return mcp


if __name__ == "__main__":
    build().run("stdio")
