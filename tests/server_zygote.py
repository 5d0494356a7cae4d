"""The tests' `python -m server` instances, forked from one process that has already
imported the server (a "zygote"), and the pytest plugin that puts it in place.

A `python -m server` spends 2-3 s of CPU on imports before it serves (15 s on a loaded
CI host), and the suite starts over a hundred of them (cluster, takeover, restart and
outage tests): minutes of a CI run spent importing. The zygote imports the third-party
modules `python -m server` imports (openai, mcp, redis, pydantic, uvicorn...: ~80% of
that time) once; a child forked from it serves in about 0.7 s. The child runs exactly
what `python -m server` runs: it imports cowrite's own modules afresh (their import-time
state is per process: a write-id prefix drawn at import, metrics registered with
prometheus_client), then runs `server.__main__.main()` with the environment it was
given, in the directory it was started from, with its own event loop, sockets and Redis
connections, and ends the way `python -m server` ends (`SystemExit` with main's code:
atexit handlers run, buffers are flushed).

`COWRITE_TESTS_SPAWN=1` starts every instance as a fresh `python -m server` instead.

Protocol, one JSON object per line: `{"env": {...}, "cwd": "..."}` on the zygote's stdin
is answered on its stdout by `{"pid": n}`; each child's end by `{"exit": n, "code": c}`
(`c` as asyncio gives a returncode: negative for a signal). At the end of its input the
zygote sends SIGTERM to every child still alive (SIGKILL after 10 s) and exits: a test
run that dies leaves no server behind.
"""

import asyncio
import contextlib
import importlib
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import orjson

from bench import common

ROOT = Path(__file__).resolve().parent.parent
# What `python -m server` imports before it serves, the lazily loaded parts too.
SERVER_IMPORTS = ("server.__main__", "server.backends.redis", "uvloop", "httptools",
                  "uvicorn.loops.uvloop", "uvicorn.protocols.http.httptools_impl",
                  "uvicorn.protocols.websockets.websockets_sansio_impl", "uvicorn.lifespan.on")
STOP_GRACE_S = 10.0


# -- the zygote (`python -m tests.server_zygote`) -------------------------------------------

class _Child(Exception):
    """Raised in a freshly forked child: unwinds the zygote's loop, whose state is not
    the child's, up to `__main__`, which runs the server."""

    def __init__(self, request: dict[str, Any]) -> None:
        super().__init__()
        self.request = request


def _send(message: dict[str, Any]) -> None:
    os.write(1, orjson.dumps(message) + b"\n")


def _reap(children: set[int]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        children.discard(pid)
        _send({"exit": pid, "code": os.waitstatus_to_exitcode(status)})


def _stop(children: set[int]) -> None:
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    while children and time.monotonic() < deadline:
        _reap(children)
        time.sleep(0.05)
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def third_party_modules() -> list[str]:
    """Every module `python -m server` imports that is not this repository's own code,
    in the order they were imported, as a fresh interpreter reports them. The
    repository's modules are left to each child: their import-time state must be the
    child's own (server/log_groups.py draws a per-process write-id prefix at import:
    forked children sharing one prefix took each other's writes for their own, and
    metrics register with prometheus_client's global registry at import)."""
    ours = {path.parent.name for path in ROOT.glob("*/__init__.py")} | {"__main__"}
    listing = subprocess.run(
        [sys.executable, "-c", "import importlib, sys\n"
         f"for name in {SERVER_IMPORTS!r}: importlib.import_module(name)\n"
         "print('\\n'.join(sys.modules))"],
        cwd=ROOT, check=True, capture_output=True, text=True).stdout
    return [name for name in listing.split() if name.split(".")[0] not in ours]


def zygote() -> None:
    """Fork a child per request line until stdin ends; report each child's end."""
    for name in third_party_modules():
        with contextlib.suppress(Exception):  # an alias, or a part that needs its parent
            importlib.import_module(name)
    leaked = sorted(name for name in sys.modules if name.split(".")[0] in ("server", "protocol"))
    assert not leaked, f"a third-party import imported cowrite's own {leaked}"
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so the wakeup fd hears it
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: pytest closes our stdin, we clean up
    signal.set_wakeup_fd(wake_w)
    children: set[int] = set()
    pending = b""
    while True:
        ready, _, _ = select.select([0, wake_r], [], [])
        if wake_r in ready:
            with contextlib.suppress(BlockingIOError):
                while os.read(wake_r, 4096):
                    pass
            _reap(children)
        if 0 not in ready:
            continue
        chunk = os.read(0, 65536)
        if not chunk:
            break
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            request = orjson.loads(line)
            pid = os.fork()
            if pid == 0:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.default_int_handler)  # as python's own
                os.close(wake_r)
                os.close(wake_w)
                raise _Child(request)
            children.add(pid)
            _send({"pid": pid})
    _stop(children)


def become_server(request: dict[str, Any]) -> int:
    """In the forked child: `python -m server` with the request's environment."""
    env: dict[str, str] = {str(k): str(v) for k, v in request["env"].items()}
    devnull = os.open(os.devnull, os.O_RDWR)
    # The zygote's pipes are not the server's: its stdout goes nowhere, as
    # `bench.common.server_process` sends it; stderr too unless BENCH_SERVER_LOGS.
    for fd in (0, 1) if env.get("BENCH_SERVER_LOGS") else (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(env)
    from server.__main__ import main

    return main()


# -- the tests' side ------------------------------------------------------------------------

class ForkedProcess:
    """What the tests use of an `asyncio.subprocess.Process`, for a zygote's child. Its
    end is reported by the zygote (it is not our child), on a thread: `wait()` works
    from any event loop, and a signal to a process already gone does nothing."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._lock = threading.Lock()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[int]]] = []

    def _exited(self, code: int) -> None:
        with self._lock:
            self.returncode = code
            waiters, self._waiters = self._waiters, []
        for loop, future in waiters:
            with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits
                loop.call_soon_threadsafe(_settle, future, code)

    async def wait(self) -> int:
        loop = asyncio.get_running_loop()
        with self._lock:
            if self.returncode is not None:
                return self.returncode
            future: asyncio.Future[int] = loop.create_future()
            self._waiters.append((loop, future))
        return await future

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _settle(future: "asyncio.Future[Any]", value: Any) -> None:
    if not future.done():
        future.set_result(value)


class Zygote:
    """The pytest process's handle on the zygote, started on first use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._asked: deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[ForkedProcess]]] \
            = deque()
        self._children: dict[int, ForkedProcess] = {}
        self._reader: threading.Thread | None = None

    async def start(self, env: dict[str, str]) -> ForkedProcess:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[ForkedProcess] = loop.create_future()
        line = orjson.dumps({"env": env, "cwd": os.getcwd()}) + b"\n"
        with self._lock:
            process = self._started()
            assert process.stdin is not None
            self._asked.append((loop, future))
            process.stdin.write(line)
            process.stdin.flush()
        return await future

    def close(self) -> None:
        with self._lock:
            process, self._process = self._process, None
            reader, self._reader = self._reader, None
        if process is None or reader is None:
            return
        assert process.stdin is not None
        process.stdin.close()  # the zygote stops its children, then exits
        try:
            process.wait(STOP_GRACE_S + 5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        reader.join()  # it read to the end and closed the pipe

    def _started(self) -> "subprocess.Popen[bytes]":
        if self._process is None:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "tests.server_zygote"], cwd=ROOT,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            self._reader = threading.Thread(target=self._read, args=(self._process,),
                                            daemon=True, name="server-zygote")
            self._reader.start()
        return self._process

    def _read(self, process: "subprocess.Popen[bytes]") -> None:
        assert process.stdout is not None
        with process.stdout:
            for line in process.stdout:
                self._dispatch(orjson.loads(line))
        with self._lock:  # the zygote ended: stopped, or it could not import the server
            asked, self._asked = list(self._asked), deque()
            if self._process is process:
                self._process = None
        for loop, future in asked:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_fail, future, RuntimeError(
                    f"the server zygote exited ({process.wait()}): run one test with "
                    "COWRITE_TESTS_SPAWN=1 to see why the server does not start"))

    def _dispatch(self, message: dict[str, Any]) -> None:
        if "pid" in message:
            child = ForkedProcess(int(message["pid"]))
            with self._lock:
                self._children[child.pid] = child
                loop, future = self._asked.popleft()
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_hand_over, future, child)
            return
        with self._lock:
            gone = self._children.pop(int(message["exit"]), None)
        if gone is not None:
            gone._exited(int(message["code"]))


def _fail(future: "asyncio.Future[Any]", error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)


def _hand_over(future: "asyncio.Future[ForkedProcess]", child: ForkedProcess) -> None:
    if future.done():  # the test gave up waiting (cancelled): nobody will stop it
        child.kill()
    else:
        future.set_result(child)


ZYGOTE = Zygote()


def pytest_configure() -> None:
    common.PIN_SERVERS = False  # a test's instances on both cores: less starved, sooner done
    if os.environ.get("COWRITE_TESTS_SPAWN") != "1":
        common.COWRITE_STARTER = ZYGOTE.start


def pytest_unconfigure() -> None:
    common.COWRITE_STARTER = None
    common.PIN_SERVERS = True
    ZYGOTE.close()


if __name__ == "__main__":
    forked: dict[str, Any] | None = None
    try:
        zygote()
    except _Child as child:
        forked = child.request
    if forked is not None:  # out of the except block: the server has no exception at hand
        raise SystemExit(become_server(forked))
