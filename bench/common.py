"""Shared bench plumbing: servers as subprocesses, /proc readings, percentiles."""

import asyncio
import contextlib
import os
import resource
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import httpx
import jwt
import orjson
from websockets.asyncio.client import ClientConnection, connect

BENCH_SECRET = "bench-secret-0123456789abcdef0123456789"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


SERVER_CORE, CLIENT_CORE = 0, 1
START_POLLS = 1200  # 50 ms apart
START_ATTEMPTS = 3  # a server that exits before it is ready gets a new port, twice


def pin(pid: int, core: int) -> bool:
    """Pin `pid` (0: this process) to one core, when the OS allows it and the core
    exists: servers on core 0 and the client on core 1, so they do not steal each
    other's time slices and the figures compare like with like."""
    setter = getattr(os, "sched_setaffinity", None)
    if setter is None or (os.cpu_count() or 1) < 2:
        return False
    try:
        setter(pid, {core})
    except OSError:
        return False
    return True


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Served(Protocol):
    """A server the client can reach: a `Proc`, or a forked instance (`bench.durable`)."""

    def url(self, path: str, scheme: str = "ws") -> str: ...


class ServerProcess(Protocol):
    """What is used of a server's process: an `asyncio.subprocess.Process`, or a child
    of the tests' zygote (tests/server_zygote.py)."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    async def wait(self) -> int: ...

    def send_signal(self, sig: int, /) -> None: ...

    def terminate(self) -> None: ...

    def kill(self) -> None: ...


# How a "cowrite" server begins, given its environment: a fresh `python -m server`
# (None), or what the tests put here, a fork of a process that already imported the
# server (tests/server_zygote.py: the imports are most of a start's 2-3 s).
COWRITE_STARTER: Callable[[dict[str, str]], Awaitable[ServerProcess]] | None = None
# Servers on core 0 (see `pin`): the bench's figures compare like with like. The tests
# turn it off: their two or three instances then share two cores, not one.
PIN_SERVERS = True


@dataclass
class Proc:
    process: ServerProcess
    port: int

    def cpu_s(self) -> float:
        with open(f"/proc/{self.process.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS

    def rss_bytes(self) -> int:
        with open(f"/proc/{self.process.pid}/statm") as f:
            return int(f.read().split()[1]) * PAGE

    def url(self, path: str, scheme: str = "ws") -> str:
        return f"{scheme}://127.0.0.1:{self.port}{path}"


def server_env(port: int, **env: str) -> dict[str, str]:
    """A bench server's environment: the bench's JWT secret, no rate limits, `env` last."""
    return {**os.environ, "COWRITE_PORT": str(port), "COWRITE_JWT_SECRET": BENCH_SECRET,
            "COWRITE_LOG_LEVEL": "warning", "COWRITE_RATE_MESSAGES_PER_S": "0",
            "COWRITE_RATE_RUNS_PER_MIN": "0", "COWRITE_MAX_CONNECTIONS_PER_USER": "0",
            "COWRITE_MAX_STEPS": "100000", **env}


@contextlib.asynccontextmanager
async def server_process(kind: str, **env: str) -> AsyncIterator[Proc]:
    """`kind` is "cowrite" (python -m server), "bare" (bench.bare_server), "sse"
    (bench.sse_server), "upstream" (bench.upstream), "phases" (the server with
    bench.phases' timestamps; it needs `PHASES_OUT` in `env`) or "skewed" (cowrite
    with its wall clock `SKEW_S` seconds off, tests/skewed_server.py)."""
    module = {"cowrite": "server", "bare": "bench.bare_server", "sse": "bench.sse_server",
              "upstream": "bench.upstream", "phases": "bench.phases",
              "skewed": "tests.skewed_server"}[kind]
    for attempt in range(START_ATTEMPTS):
        port = free_port()
        process: ServerProcess
        if kind == "cowrite" and COWRITE_STARTER is not None:
            process = await COWRITE_STARTER(server_env(port, **env))
        else:
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", module, env=server_env(port, **env),
                stdout=subprocess.DEVNULL,
                stderr=None if os.environ.get("BENCH_SERVER_LOGS") else subprocess.DEVNULL)
        if PIN_SERVERS:
            pin(process.pid, SERVER_CORE)
        proc = Proc(process, port)
        try:
            await wait_ready(proc, kind)
            break
        except ServerExited:  # the free port was taken before it bound (others' tests)
            if attempt == START_ATTEMPTS - 1:
                raise
        except BaseException:
            process.kill()
            await process.wait()
            raise
    try:
        yield proc
    finally:
        if process.returncode is None:
            process.terminate()
        try:
            await asyncio.wait_for(process.wait(), 10)
        except TimeoutError:
            process.kill()
            await process.wait()


class ServerExited(RuntimeError):
    """The server process ended before it answered (it could not bind its port, say)."""


async def wait_ready(server: Served, kind: str = "cowrite") -> None:
    """Until `GET /healthz` answers 200: up to a minute, since on a loaded shared
    machine the imports alone took 15 s; at once when the process has ended (it
    used to be waited for a whole minute, then "did not start")."""
    process: asyncio.subprocess.Process | None = getattr(server, "process", None)
    async with httpx.AsyncClient() as http:
        for _ in range(START_POLLS):
            if process is not None and process.returncode is not None:
                raise ServerExited(f"{kind} server exited with {process.returncode} "
                                   "before it was ready")
            with contextlib.suppress(httpx.HTTPError):
                if (await http.get(server.url("/healthz", "http"))).status_code == 200:
                    return
            await asyncio.sleep(0.05)
    raise RuntimeError(f"{kind} server did not start")


def bench_token(sub: str = "bench") -> str:
    return jwt.encode({"sub": sub, "docs": ["*"], "exp": int(time.time()) + 3600}, BENCH_SECRET,
                      algorithm="HS256")


async def cowrite_join(proc: Served, document_id: str, client_id: str, sub: str = "bench"
                       ) -> tuple[ClientConnection, dict[str, Any]]:
    ws = await connect(proc.url(f"/v1/documents/{document_id}/ws"), compression=None,
                       max_size=None, ping_interval=None)
    await ws.send(orjson.dumps({"type": "hello", "protocol": 1, "client_id": client_id,
                                "token": bench_token(sub)}).decode())
    welcome = orjson.loads(await ws.recv())
    return ws, welcome


async def start_tool_run(proc: Served, document_id: str, calls: int) -> ClientConnection:
    """A joined connection whose run asks for `calls` client tool calls (`read_document`)."""
    ws, _ = await cowrite_join(proc, document_id, "executor")
    await ws.send(orjson.dumps({"type": "run.start", "tools": [READ_TOOL],
                                "prompt": script_prompt("done", 4, tool_steps=calls),
                                "options": {"max_steps": calls + 1}}).decode())
    return ws


async def next_of_type(ws: ClientConnection, kind: str) -> dict[str, Any]:
    """The next event of type `kind` (the others are read and dropped)."""
    while True:
        event: dict[str, Any] = orjson.loads(await ws.recv())
        if event["type"] == kind:
            return event


def result_frame(call: dict[str, Any]) -> str:
    """The bench's `tool.result` for a `tool.call` event."""
    return orjson.dumps({"type": "tool.result", "run_id": call["run_id"],
                         "call_id": call["call_id"], "token": call["token"],
                         "output": {"text": "doc"}}).decode()


async def answer_call(ws: ClientConnection, call: dict[str, Any], until: str = "tool.call"
                      ) -> dict[str, Any]:
    """Send `call`'s `tool.result`; the next event of type `until`."""
    await ws.send(result_frame(call))
    return await next_of_type(ws, until)


class LoopLag:
    """How late this process's own event loop wakes a 5 ms sleep, sampled for as
    long as it runs: a load generator whose loop lags measures itself, not the
    server, so its reports say how busy it was."""

    PERIOD_S = 0.005

    def __init__(self) -> None:
        self.lags_ms: list[float] = []
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._probe())

    async def stop(self) -> list[float]:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        return self.lags_ms

    async def _probe(self) -> None:
        while True:
            t0 = time.perf_counter()
            await asyncio.sleep(self.PERIOD_S)
            self.lags_ms.append(max(0.0, (time.perf_counter() - t0 - self.PERIOD_S) * 1000))


def process_cpu_s() -> float:
    """CPU seconds (user + system) this process has used so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def script_prompt(text: str, chunk_chars: int, delay_ms: float = 0,
                  tool_steps: int = 0) -> str:
    steps: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "read_document", "arguments": {}}]} for _ in range(tool_steps)]
    steps.append({"say": text})
    return orjson.dumps({"script": steps, "chunk_chars": chunk_chars,
                         "delay_ms": delay_ms}).decode()


READ_TOOL = {"name": "read_document", "description": "Read the document.",
             "parameters": {"type": "object", "properties": {}}}


@contextlib.asynccontextmanager
async def redis_server() -> AsyncIterator[str]:
    """A throwaway redis-server on a free port (no persistence); yields its URL."""
    import shutil
    import tempfile

    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="cowrite-bench-redis-") as directory:
        process = await asyncio.create_subprocess_exec(
            binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--dir", directory,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(200):
                try:
                    _, writer = await asyncio.open_connection("127.0.0.1", port)
                    writer.close()
                    break
                except OSError:
                    await asyncio.sleep(0.02)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            process.terminate()
            await process.wait()
