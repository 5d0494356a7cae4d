"""The server tools of one cowrite instance, from every source, behind one interface.

Sources, in priority order: the built-ins, the `[[tools]]` Python tools, then
the `[[mcp]]` servers, each in file order. Names are unique across sources:
when two entries want the same name, the first keeps it and the later one is
reported unavailable with a `problem` naming the other, never silently
shadowed. An entry that is broken itself (a tool that cannot be loaded, an
MCP tool whose name or schema is unusable) claims no name against one that
can work, and is reported with its own problem. Tools that cannot be loaded,
and MCP servers that are down, are reported (`describe()`) but not offered
(`specs()`); startup never fails because of them, only because of an invalid
config file.

`invoke` never raises (except CancelledError, which it lets through so that
an abort reaches the running tool): every outcome is a `ToolInvocation`, and
no exception text ever reaches its `error`. It bounds a call in time (the
tool's `timeout_s`) and its output in size (`max_output_bytes` of JSON, the
size of a client tool's result: every client gets the output in `tool.done`
and the document log keeps it); an output over it, or one JSON cannot
encode, is the tool's failure (`too_large`, `internal`), which the model is
told, rather than a frame clients refuse.
"""

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from protocol.jsonlimits import nesting_over
from server.tools.builtin import BUILTIN_IMPORTS
from server.tools.config import CowriteConfig, McpServerConfig, PythonToolConfig, Workflow
from server.tools.context import ToolContext, ToolError, ToolUnavailable
from server.tools.mcp_results import placeholder_names
from server.tools.mcp_source import McpConnection, McpTimings
from server.tools.pytools import PythonTool, ToolLoadError, load_python_tool
from server.tools.schemas import argument_check

log = logging.getLogger("cowrite.tools")


@dataclass(frozen=True)
class ServerToolSpec:
    """A tool the server runs itself, as the run engine offers it to the model."""

    name: str
    description: str
    parameters: dict[str, Any]  # JSON Schema object
    source: str  # "builtin" | "python" | "mcp:<server>"
    requires_approval: bool
    timeout_s: float
    idempotent: bool


@dataclass(frozen=True)
class ToolInvocation:
    """What `invoke` returns: `error` is `{"message", "code"}`, safe for the model."""

    status: Literal["ok", "error", "timeout"]
    output: Any = None
    error: dict[str, Any] | None = None


MAX_ERROR_BYTES = 4096  # of a tool's error message, UTF-8; the rest is cut (every client gets it)
DEEPEST_OUTPUT = 128  # levels of nesting in an output when COWRITE_MAX_JSON_DEPTH is 0: the
# events that carry it (and the adapters' frames around them) must stay within orjson's 254
STOP_GRACE_S = 1.0  # a cancelled tool gets this long to stop before it is left to finish alone


def _failed(message: str, code: str) -> ToolInvocation:
    encoded = message.encode("utf-8", "replace")
    message = encoded.decode()  # a lone surrogate (a file name os.fsdecode kept) failed the run
    if len(encoded) > MAX_ERROR_BYTES:  # bytes, not characters: 4096 emoji were 16 KB
        kept = encoded[:MAX_ERROR_BYTES].decode("utf-8", "ignore")
        message = f"{kept} [... {len(encoded) - len(kept.encode())} more bytes cut]"
    return ToolInvocation("error", error={"message": message, "code": code})


class _ToolExited(Exception):
    """A tool raised a BaseException that is neither an Exception nor a cancel
    (SystemExit, KeyboardInterrupt, GeneratorExit, a library's own): in a task of its
    own, it would stop the event loop or fail the whole run."""


async def _contained(call: Awaitable[Any]) -> Any:
    try:
        return await call
    except (Exception, asyncio.CancelledError):
        raise
    except BaseException as exc:  # SystemExit, GeneratorExit, a library's own (gevent's)
        raise _ToolExited(type(exc).__name__) from exc


def _when_stopped(name: str, ctx: ToolContext) -> Callable[["asyncio.Task[Any]"], None]:
    """For a cancelled tool's task: its outcome retrieved (asyncio would log it as never
    retrieved), and a warning when it ended past the grace, having ignored the cancel."""
    cancelled_at = time.monotonic()

    def ended(task: "asyncio.Task[Any]") -> None:
        if not task.cancelled():
            task.exception()
        late = time.monotonic() - cancelled_at
        if late > STOP_GRACE_S:
            ctx.logger.warning("server tool %s ignored its cancellation; it ended %.1f s "
                               "later", name, late)
    return ended


def _unchecked(_arguments: dict[str, Any]) -> str | None:
    return None


@dataclass
class _Entry:
    spec: ServerToolSpec
    problem: str | None
    run: Callable[[dict[str, Any], ToolContext], Awaitable[Any]] | None = None
    check: Callable[[dict[str, Any]], str | None] = _unchecked
    broken: bool = False  # the problem is the entry's own, not its server's being down


class ToolCatalog:
    """Built-in, Python and MCP server tools, plus the operator's workflows."""

    def __init__(self, config: CowriteConfig | None = None, *, default_timeout_s: float = 10.0,
                 mcp_timings: McpTimings | None = None, max_output_bytes: int = 1_048_576,
                 max_output_depth: int = 64) -> None:
        config = config or CowriteConfig()
        self.default_timeout_s, self.max_output_bytes = default_timeout_s, max_output_bytes
        self.max_output_depth = max_output_depth if max_output_depth > 0 else DEEPEST_OUTPUT
        self._workflows = {w.name: w for w in config.workflows}
        self._static = self._load_python(config.tools)
        timings = mcp_timings or McpTimings()
        # A stdio server's line holds one JSON-RPC message around the output: twice the
        # output limit leaves room for its envelope and JSON escapes.
        self._mcp = [McpConnection(c, timings, max_line_bytes=2 * max_output_bytes)
                     for c in config.mcp if c.enabled]
        self._mcp_cache: dict[str, tuple[int, list[_Entry]]] = {}

    # Loading -----------------------------------------------------------------

    def _load_python(self, entries: list[PythonToolConfig]) -> list[_Entry]:
        by_import = {e.import_: e for e in entries}
        ordered = [(imp, by_import.get(imp), "builtin") for imp in BUILTIN_IMPORTS]
        ordered += [(e.import_, e, "python") for e in entries if e.import_ not in BUILTIN_IMPORTS]
        loaded = []
        for import_string, entry, source in ordered:
            if entry is not None and not entry.enabled:
                continue
            entry = entry or PythonToolConfig.model_validate({"import": import_string})
            loaded.append(self._python_entry(import_string, entry, source))
        return loaded

    def _python_entry(self, import_string: str, entry: PythonToolConfig, source: str) -> _Entry:
        def spec(name: str, description: str, parameters: dict[str, Any]) -> ServerToolSpec:
            return ServerToolSpec(
                name, description, parameters, source, entry.requires_approval,
                entry.timeout_s or self.default_timeout_s, entry.idempotent)

        try:
            tool: PythonTool = load_python_tool(import_string, entry.name)
        except ToolLoadError as exc:
            log.warning("tool %s is unavailable: %s", import_string, exc, exc_info=exc.__cause__)
            name = entry.name or import_string.rpartition(":")[2].rpartition(".")[2]
            return _Entry(spec(name, "", {"type": "object", "properties": {}}), str(exc),
                          broken=True)
        return _Entry(spec(tool.name, tool.description, tool.parameters), None, tool.call,
                      tool.check)

    def _mcp_entries(self, connection: McpConnection) -> list[_Entry]:
        """The entries of one server, rebuilt (validators too) only when its state changed."""
        cached = self._mcp_cache.get(connection.name)
        if cached is None or cached[0] != connection.version:
            cached = (connection.version, self._build_mcp_entries(connection))
            self._mcp_cache[connection.name] = cached
        return cached[1]

    def _build_mcp_entries(self, connection: McpConnection) -> list[_Entry]:
        config: McpServerConfig = connection.config
        source = f"mcp:{config.name}"

        def spec(name: str, description: str, parameters: dict[str, Any]) -> ServerToolSpec:
            return ServerToolSpec(
                name, description, parameters, source, config.requires_approval,
                config.timeout_s or self.default_timeout_s, config.idempotent)

        if not connection.ever_up:
            return [_Entry(spec(name, f"tools of MCP server {config.name}",
                                {"type": "object", "properties": {}}), connection.problem)
                    for name in placeholder_names(config)]
        entries = []
        for tool in connection.tools:
            problem, broken = tool.problem or connection.problem, tool.problem is not None
            check = argument_check(tool.name, tool.parameters) if problem is None else None
            if isinstance(check, str):  # one tool's schema, not the catalog, is unusable
                problem, check, broken = check, None, True

            async def run(arguments: dict[str, Any], _: ToolContext, mcp_name: str = tool.mcp_name
                          ) -> Any:
                return await connection.call(mcp_name, arguments)

            entries.append(_Entry(spec(tool.name, tool.description, tool.parameters), problem,
                                  run, check or _unchecked, broken))
        return entries

    def _resolve(self) -> tuple[dict[str, _Entry], list[_Entry]]:
        """Every tool by name, and every entry as `describe` reports it, in source order.

        Names go first come first served, but broken entries come last: one that cannot
        load must not take the name of one that works (a broken `[[tools]]` entry listed
        first made both unavailable). A broken entry keeps its own problem."""
        entries = [*self._static, *(e for c in self._mcp for e in self._mcp_entries(c))]
        resolved: dict[str, _Entry] = {}
        for entry in sorted(entries, key=lambda e: e.broken):  # stable: order kept within
            resolved.setdefault(entry.spec.name, entry)
        described = []
        for entry in entries:
            owner = resolved[entry.spec.name]
            if owner is not entry and not entry.broken:
                entry = _Entry(entry.spec, f"duplicate name: also defined by {owner.spec.source}")
            described.append(entry)
        return resolved, described

    def _entries(self) -> dict[str, _Entry]:
        return self._resolve()[0]

    # Lifecycle ---------------------------------------------------------------

    async def start(self) -> None:
        """Connect every MCP server; each gets one attempt before this returns."""
        await asyncio.gather(*(c.start() for c in self._mcp))

    async def close(self) -> None:
        await asyncio.gather(*(c.close() for c in self._mcp))

    async def changed(self) -> None:
        """Return when an MCP server goes up or down or its tool list changes."""
        waits = [asyncio.ensure_future(c.wait_changed()) for c in self._mcp]
        if not waits:
            await asyncio.Future()  # nothing can change: wait until cancelled
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()

    # Queries -----------------------------------------------------------------

    def specs(self) -> list[ServerToolSpec]:
        """The tools available now (a list to offer the model)."""
        return [e.spec for e in self._entries().values() if e.problem is None]

    def spec(self, name: str) -> ServerToolSpec | None:
        entry = self._entries().get(name)
        return entry.spec if entry is not None and entry.problem is None else None

    def describe(self) -> list[dict[str, Any]]:
        """`GET /v1/tools` entries, the unavailable ones included (disabled ones are not)."""
        described = []
        for entry in self._resolve()[1]:
            item: dict[str, Any] = {
                "name": entry.spec.name, "description": entry.spec.description,
                "parameters": entry.spec.parameters, "source": entry.spec.source,
                "requires_approval": entry.spec.requires_approval,
                "available": entry.problem is None,
            }
            if entry.problem is not None:
                item["problem"] = entry.problem
            described.append(item)
        return described

    def check(self, name: str, arguments: dict[str, Any]) -> dict[str, Any] | str:
        """The arguments when the call is valid, else the error message for the model."""
        entry = self._entries().get(name)
        if entry is None:
            return f"unknown server tool {name!r}"
        if entry.problem is not None:
            return f"tool {name} is unavailable: {entry.problem}"
        if not isinstance(arguments, dict):
            return f"arguments of {name} must be a JSON object"
        problem = entry.check(arguments)
        return arguments if problem is None else problem

    def workflows(self) -> list[Workflow]:
        return list(self._workflows.values())

    def workflow(self, name: str) -> Workflow | None:
        return self._workflows.get(name)

    # Calls -------------------------------------------------------------------

    async def invoke(self, name: str, arguments: dict[str, Any], ctx: ToolContext
                     ) -> ToolInvocation:
        """Run one tool call to its end; cancelling the caller cancels the tool."""
        entry = self._entries().get(name)
        checked = self.check(name, arguments)
        if isinstance(checked, str) or entry is None or entry.run is None:
            usable = entry is not None and entry.problem is None
            return _failed(str(checked), "invalid_arguments" if usable else "unavailable")
        started = time.monotonic()
        result = await self._run(entry, checked, ctx)
        ctx.logger.info("server tool %s (%s): %s in %.0f ms", name, entry.spec.source,
                        result.error["code"] if result.error else result.status,
                        (time.monotonic() - started) * 1000)
        return result

    async def _run(self, entry: _Entry, arguments: dict[str, Any], ctx: ToolContext
                   ) -> ToolInvocation:
        """The tool runs in a task of its own, so that neither its timeout nor the run's
        cancel waits on a tool that ignores cancellation (it gets `STOP_GRACE_S`, then is
        left to finish alone), and a `CancelledError` the tool raises itself (an inner
        operation of its was cancelled) is its failure, not the run's."""
        assert entry.run is not None
        name, timeout_s = entry.spec.name, entry.spec.timeout_s
        task = asyncio.ensure_future(_contained(entry.run(arguments, ctx)))
        try:
            await asyncio.wait((task,), timeout=timeout_s)
        except asyncio.CancelledError:  # the run ended or went on without this call
            await self._stop(task, name, ctx)
            raise
        if not task.done():
            await self._stop(task, name, ctx)
            return ToolInvocation(
                "timeout", error={"message": f"{name} took longer than {timeout_s:g} s",
                                  "code": "timeout"})
        try:
            output = task.result()
        except ToolError as exc:
            return _failed(str(exc.message), "tool_error")
        except ToolUnavailable as exc:
            return _failed(str(exc.message), "unavailable")
        except (Exception, asyncio.CancelledError):
            return self._internal(name, ctx)
        try:
            encoded = orjson.dumps(output)
        except (TypeError, ValueError):
            return self._internal(name, ctx)  # the log cannot hold it
        size = len(encoded)
        if nesting_over(encoded, self.max_output_depth):  # as a client's result would be
            return _failed(f"{name} returned output nested deeper than "
                           f"{self.max_output_depth} levels", "too_large")
        if size > self.max_output_bytes:
            ctx.logger.warning("server tool %s returned %d bytes of JSON, over the limit of %d",
                               name, size, self.max_output_bytes)
            return _failed(f"{name} returned {size} bytes of output; the limit is "
                           f"{self.max_output_bytes}", "too_large")
        return ToolInvocation("ok", output=output)

    @staticmethod
    async def _stop(task: "asyncio.Task[Any]", name: str, ctx: ToolContext) -> None:
        """Cancel, and wait up to `STOP_GRACE_S` for the tool to stop. The callback comes
        first: a second cancel of the caller cuts the wait short, not the bookkeeping."""
        task.cancel()
        task.add_done_callback(_when_stopped(name, ctx))
        await asyncio.wait((task,), timeout=STOP_GRACE_S)

    @staticmethod
    def _internal(name: str, ctx: ToolContext) -> ToolInvocation:
        ref = secrets.token_hex(4)
        ctx.logger.exception("server tool %s failed (ref %s)", name, ref)
        return _failed(f"tool failed (ref {ref})", "internal")
