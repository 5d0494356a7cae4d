"""cowrite's stdio transport for MCP servers, given to the SDK's `Client` as a transport.

It does what the SDK's `stdio_client` does (start the command in a session of
its own with the safe default environment plus the config's `env`, one
JSON-RPC message per stdout line, and on close: stdin closed, 2 s to exit,
SIGTERM to the process group, 2 s, SIGKILL), with three differences:

- Lines are cut from a byte buffer, searching each byte once. The SDK joined
  and split a text buffer on every 64 KB read: quadratic in a line's length, a
  20 MB answer held the event loop 3 s, 60 MB 38 s, for every document.
- A line may hold at most `max_line_bytes` (twice COWRITE_MAX_MESSAGE_BYTES).
  A longer one ends the connection: its calls fail, the server is restarted.
- Bytes that are not UTF-8 are replaced, so such a line is one unparseable
  line (ignored, logged). The SDK's strict decoding failed inside its drain of
  stdout, and the connection hung, every call waiting out its timeout, until
  the next poll.

A server that exits while a process it started still holds its stdout (a helper
that inherited it) is noticed by its exit, not only by stdout's end: within
`_EXIT_POLL_S` + `_STDERR_S` its calls fail and it is restarted (they waited out
their timeouts until the next poll).

The server's stderr is read here too: each line is logged at debug level
(`cowrite.tools.mcp.stderr`) and the last few are kept, for the one line that
says why the server stopped (the SDK passed it to cowrite's stderr, a
traceback printed again on every restart).
"""

import logging
import os
import subprocess
import sys
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field

import anyio
import anyio.lowlevel
import mcp.types as mcp_types
from anyio.abc import ByteReceiveStream, Process
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp import StdioServerParameters
from mcp.client.stdio import get_default_environment
from mcp.os.posix.utilities import terminate_posix_process_tree
from mcp.shared.message import SessionMessage

log = logging.getLogger("cowrite.tools.mcp")
stderr_log = logging.getLogger("cowrite.tools.mcp.stderr")

EXIT_GRACE_S = 2.0  # after stdin closes, as the SDK and the MCP spec's shutdown
KILL_GRACE_S = 2.0  # after SIGTERM, before SIGKILL
_REAP_S = 2.0  # for the loop to see a killed process gone
_FLUSH_S = 0.5  # for the writer to send what it accepted before stdin closes
_STDERR_S = 0.5  # for the last stderr lines of an exited server to be read
_POLL_S = 0.01
_EXIT_POLL_S = 0.25  # how often a running server's process is checked for an exit
STDERR_LINES_KEPT = 10
STDERR_LINE_CHARS = 500
_PIPE_ERRORS = (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError,
                OSError)

ReadStreams = tuple[MemoryObjectReceiveStream[SessionMessage | Exception],
                    MemoryObjectSendStream[SessionMessage]]


@dataclass
class StdioState:
    """What one connection's transport saw: read by the supervisor when the
    connection ends, to say why in one line."""

    max_line_bytes: int
    oversized: bool = False  # a line went over max_line_bytes
    ended: bool = False  # stdout ended (or was cut) before cowrite closed the connection
    exit_code: int | None = None  # the code of a process that ended by itself
    bad_lines: int = 0
    stderr_tail: deque[str] = field(default_factory=lambda: deque(maxlen=STDERR_LINES_KEPT))


@asynccontextmanager
async def stdio_transport(params: StdioServerParameters, state: StdioState, name: str,
                          on_end: Callable[[], None]) -> AsyncIterator[ReadStreams]:
    """Start the server and yield the streams the SDK's session reads and writes.
    `on_end` is called when its stdout ends or is cut while the connection is in use."""
    process = await anyio.open_process(
        [params.command, *params.args], env=get_default_environment() | (params.env or {}),
        stderr=subprocess.PIPE, cwd=params.cwd, start_new_session=True)
    # No await between the spawn and the task group (as in the SDK): a cancellation
    # there would leave the process running.
    read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)
    writer_done, stderr_done, stdout_done = anyio.Event(), anyio.Event(), anyio.Event()
    shutting_down = False

    async def stdout_reader() -> None:
        assert process.stdout is not None
        try:
            async with read_writer:
                await _read_messages(process.stdout, read_writer, state, name)
        except _PIPE_ERRORS:
            pass  # the session is gone, or our own shutdown closed the pipe
        stdout_done.set()
        if not shutting_down:
            state.ended = True
            on_end()
        await _drain(process.stdout)  # a server blocked on a full pipe cannot exit

    async def exit_watcher() -> None:
        """The process gone while its stdout stays open (held by a process it started):
        end the connection as if stdout had ended, once what it wrote has been read."""
        while process.returncode is None:  # noqa: ASYNC110 - see _exited
            await anyio.sleep(_EXIT_POLL_S)
        with anyio.move_on_after(_STDERR_S):
            await stdout_done.wait()
        if stdout_done.is_set() or shutting_down:
            return
        log.info("mcp server %s exited (code %s) while a process it started still holds "
                 "its stdout", name, process.returncode)
        state.ended = True
        await read_writer.aclose()  # the session sees the end: its requests fail at once
        on_end()

    async def stderr_reader() -> None:
        assert process.stderr is not None
        try:
            with anyio.CancelScope(shield=True):  # ends when the pipe ends or is closed
                await _read_stderr(process.stderr, state, name)
        finally:
            stderr_done.set()

    async def stdin_writer() -> None:
        assert process.stdin is not None
        try:
            async with write_reader:
                async for message in write_reader:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await process.stdin.send((data + "\n").encode(errors="replace"))
        except _PIPE_ERRORS:
            await read_writer.aclose()  # the session sees the end, no request waits forever
        finally:
            writer_done.set()

    async def shutdown() -> None:
        read_stream.close()  # the reader goes on to drain: a server stuck writing can exit
        write_stream.close()
        with anyio.move_on_after(_FLUSH_S):
            await writer_done.wait()
        if state.ended and not state.oversized:  # did the process exit by itself?
            await _exited(process, _STDERR_S)
            state.exit_code = process.returncode
        await _stop(process)
        with anyio.move_on_after(_STDERR_S):
            await stderr_done.wait()
        for pipe in (process.stdout, process.stderr):
            if pipe is not None:
                await _close(pipe)
        _close_transport(process)
        for stream in (read_stream, write_stream, read_writer, write_reader):
            await stream.aclose()
        await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as group:
        group.start_soon(stdout_reader)
        group.start_soon(stderr_reader)
        group.start_soon(stdin_writer)
        group.start_soon(exit_watcher)
        try:
            yield read_stream, write_stream
        finally:
            shutting_down = True
            with anyio.CancelScope(shield=True):  # bounded; the process must not be left
                await shutdown()
            group.cancel_scope.cancel()
    await anyio.lowlevel.cancel_shielded_checkpoint()


async def _read_messages(stdout: ByteReceiveStream,
                         send: MemoryObjectSendStream[SessionMessage | Exception],
                         state: StdioState, name: str) -> None:
    """Deliver one message per line until stdout ends or a line is too long. Each
    byte is searched for a newline once; a line is copied out once."""
    buffer, searched, cap = bytearray(), 0, state.max_line_bytes
    while True:
        try:
            buffer += await stdout.receive()
        except anyio.EndOfStream:
            return
        start, ignored = 0, 0
        while (end := buffer.find(b"\n", searched)) >= 0 and end - start <= cap:
            message = _parse(buffer[start:end], state, name)
            start = searched = end + 1
            if message is not None:
                await send.send(message)
            else:
                ignored += 1
                if ignored % 256 == 0:  # a flood of ignored lines held the event loop
                    await anyio.lowlevel.checkpoint()
        del buffer[:start]
        searched = len(buffer)  # what is left holds no newline (or is over the cap)
        if len(buffer) > cap:
            state.oversized = True  # the supervisor's log line says so
            return


def _parse(line: bytearray, state: StdioState, name: str) -> SessionMessage | None:
    text = line.decode("utf-8", errors="replace").strip()
    if not text:
        return None
    try:
        message = mcp_types.jsonrpc_message_adapter.validate_json(text, by_name=False)
    except ValueError:
        state.bad_lines += 1
        log.log(logging.WARNING if state.bad_lines == 1 else logging.DEBUG,
                "mcp server %s wrote a line to stdout that is not a JSON-RPC message "
                "(ignored; %d so far): %r", name, state.bad_lines, text[:200])
        return None
    return SessionMessage(message)


async def _read_stderr(stderr: ByteReceiveStream, state: StdioState, name: str) -> None:
    """Log each line at debug level and keep the last few. A line is cut after
    STDERR_LINE_CHARS (so the buffer stays small), the rest of it dropped."""
    buffer, skipping, limit = bytearray(), False, STDERR_LINE_CHARS * 4
    while True:
        try:
            chunk = await stderr.receive()
        except _PIPE_ERRORS:
            break
        *lines, rest = chunk.split(b"\n")
        for number, line in enumerate(lines, start=1):
            if not skipping:
                _stderr_line(buffer + line, state, name)
            buffer.clear()
            skipping = False
            if number % 256 == 0:  # a flood of lines held the event loop
                await anyio.lowlevel.checkpoint()
        if not skipping:
            buffer += rest
            if len(buffer) > limit:
                _stderr_line(buffer, state, name)
                buffer.clear()
                skipping = True
    if buffer:
        _stderr_line(buffer, state, name)


def _stderr_line(raw: bytearray, state: StdioState, name: str) -> None:
    line = raw.decode("utf-8", errors="replace").rstrip()[:STDERR_LINE_CHARS]
    if line:
        state.stderr_tail.append(line)
        stderr_log.debug("mcp server %s stderr: %s", name, line)


async def _drain(stdout: ByteReceiveStream) -> None:
    with anyio.CancelScope(shield=True), suppress(*_PIPE_ERRORS):
        while True:
            await stdout.receive()


async def _exited(process: Process, timeout_s: float) -> bool:
    """Whether the process is gone within `timeout_s` (not `process.wait()`: that also
    waits for the pipes, which a child of the server may hold open)."""
    with anyio.move_on_after(timeout_s):
        while process.returncode is None:  # noqa: ASYNC110 - a process has no event
            await anyio.sleep(_POLL_S)
    return process.returncode is not None


async def _stop(process: Process) -> None:
    """stdin closed, EXIT_GRACE_S to exit, then the process group is ended."""
    if process.stdin is not None:
        await _close(process.stdin)
    if await _exited(process, EXIT_GRACE_S) and not _group_alive(process.pid):
        return  # (a helper it started, still in its group, was left running: ended below)
    if sys.platform == "win32":  # pragma: no cover
        with suppress(OSError):
            process.kill()
    else:
        await terminate_posix_process_tree(process, KILL_GRACE_S)
    if not await _exited(process, _REAP_S):
        log.warning("mcp server process %d is still alive after SIGKILL; left behind",
                    process.pid)


def _group_alive(pgid: int) -> bool:
    """Whether a process of the server's group (its own session) still runs."""
    if sys.platform == "win32":  # pragma: no cover
        return False
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _close_transport(process: Process) -> None:
    """Close asyncio's subprocess transport (as the SDK does, by attribute): a child of
    the server holding a pipe open keeps it open, and it warns when collected."""
    transport = getattr(getattr(process, "_process", None), "_transport", None)
    close = getattr(transport, "close", None)
    if callable(close):
        with suppress(PermissionError):
            close()


async def _close(pipe: anyio.abc.AsyncResource) -> None:
    with suppress(*_PIPE_ERRORS):
        await pipe.aclose()
