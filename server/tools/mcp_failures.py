"""Why an MCP server is down, in one line: what to fix, not a traceback.

Two spellings of each reason: `problem`, served by `GET /v1/tools`, holds no
exception text and none of the config's command, paths or URLs; `logged`, for
the operator's log, names the one that failed.
"""

import os
import socket
from dataclasses import dataclass

import anyio
import httpx2
import mcp.types as mcp_types
from mcp.shared.exceptions import MCPError

from server.tools.config import McpServerConfig

# What a connection that went away raises; httpx2 is the HTTP client of the SDK's
# streamable-HTTP transport (an unreachable server raised an 80-line ExceptionGroup).
CONNECTION_ERRORS = (OSError, anyio.ClosedResourceError, anyio.BrokenResourceError,
                     anyio.EndOfStream, httpx2.TransportError)


class WorkingDirectoryUnusable(Exception):
    """The `cwd` of a stdio server is not a directory (checked before starting it: the
    spawn's FileNotFoundError would blame the command)."""


def check_cwd(config: McpServerConfig) -> None:
    if config.cwd is not None and not os.path.isdir(config.cwd):
        raise WorkingDirectoryUnusable


@dataclass(frozen=True)
class Failure:
    problem: str  # safe to serve
    logged: str  # for the log: may name the command, cwd or URL
    expected: bool = True  # False: a failure nobody foresaw, worth its traceback


def innermost(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _causes(exc: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    seen: BaseException | None = exc
    while seen is not None and seen not in chain and len(chain) < 20:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    return chain


def _why_no_connection(exc: httpx2.ConnectError) -> str:
    for cause in _causes(exc):
        if isinstance(cause, ConnectionRefusedError):
            return "connection refused"
        if isinstance(cause, socket.gaierror):
            return "host name not found"
    return "connection failed"


def describe_failure(exc: BaseException, config: McpServerConfig) -> Failure:
    exc = innermost(exc)
    url = config.url
    if isinstance(exc, TimeoutError | httpx2.TimeoutException):
        return Failure("no answer in time", "no answer in time")
    if isinstance(exc, WorkingDirectoryUnusable):
        return Failure("its working directory does not exist",
                       f"its working directory does not exist (cwd {str(config.cwd)!r})")
    if isinstance(exc, FileNotFoundError | PermissionError) and config.command:
        return Failure("its command cannot be started",
                       f"its command cannot be started (command {config.command[0]!r})")
    if isinstance(exc, httpx2.ConnectError):
        why = _why_no_connection(exc)
        return Failure(f"cannot connect: {why}", f"cannot connect to {url}: {why}")
    if isinstance(exc, MCPError):
        if exc.code == mcp_types.CONNECTION_CLOSED:
            return Failure("connection closed", "connection closed")
        if url is not None and exc.code == mcp_types.METHOD_NOT_FOUND \
                and exc.error.message == "Not Found":  # the SDK's stand-in for an HTTP 404
            return Failure("its URL answered 404 Not Found",
                           f"{url} answered 404 Not Found (is the path right?)")
        return Failure(f"MCP error {exc.code}", f"MCP error {exc.code}")
    if isinstance(exc, CONNECTION_ERRORS):
        return Failure("connection lost", "connection lost")
    name = type(exc).__name__
    return Failure(name, name, expected=False)
