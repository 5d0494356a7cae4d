"""Helpers shared by the tool tests: a ToolContext, a catalog from TOML text, waiting."""

import asyncio
import contextlib
import logging
import tomllib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from server.tools.catalog import ToolCatalog
from server.tools.config import parse_config
from server.tools.context import ToolContext
from server.tools.mcp_source import McpTimings

FAST = McpTimings(connect_timeout_s=10.0, retry_min_s=0.05, retry_max_s=0.5, poll_s=30.0)


def tool_context(run_id: str = "run-1") -> ToolContext:
    logger = logging.LoggerAdapter(logging.getLogger("cowrite.tools.test"), {"run_id": run_id})
    return ToolContext(run_id=run_id, document_id="doc-1", user_id="alice", logger=logger)


def catalog(toml: str = "", *, timings: McpTimings = FAST, max_output_bytes: int = 1_048_576
            ) -> ToolCatalog:
    return ToolCatalog(parse_config(tomllib.loads(toml)), default_timeout_s=5.0,
                       mcp_timings=timings, max_output_bytes=max_output_bytes)


async def until(tools: ToolCatalog, predicate: Callable[[], bool], timeout: float = 10.0
                ) -> None:
    """Wait for the catalog's change events until `predicate()` holds."""
    async with asyncio.timeout(timeout):
        while not predicate():
            await tools.changed()


async def file_says(path: Path, line: str, timeout: float = 10.0) -> None:
    """Wait until the MCP server (another process) has written `line` to `path`.

    The file is the only channel out of the server's process, so it is read
    every 20 ms until the line is there.
    """
    def written() -> list[str]:
        return path.read_text().splitlines() if path.exists() else []

    async with asyncio.timeout(timeout):
        while line not in written():  # noqa: ASYNC110
            await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def started_catalog(toml: str, timings: McpTimings = FAST
                          ) -> AsyncIterator[ToolCatalog]:
    """A catalog of `toml`, started (its MCP servers connecting), closed after."""
    tools = catalog(toml, timings=timings)
    await tools.start()
    try:
        yield tools
    finally:
        await tools.close()


def available(tools: ToolCatalog) -> dict[str, bool]:
    """Each listed tool's name and whether it can be called now."""
    return {entry["name"]: entry["available"] for entry in tools.describe()}

