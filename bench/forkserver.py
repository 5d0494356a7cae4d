"""`python -m bench.forkserver`: cowrite instances forked from one process that has
already imported the server, for the takeover benchmark (`bench.durable`).

That benchmark kills 50 owners with SIGKILL, so it needs 50 fresh instances. A
`python -m server` costs about 1.5 s of CPU on these machines, almost all of it
imports (1.1 s), which would make the benchmark several minutes long and load the
core the surviving instance measures on. Each child here runs exactly what
`python -m server` runs (`server.__main__.main`, settings read from the environment
it was given, its own event loop, sockets and Redis connections); only the imported
modules are shared, copy-on-write.

Protocol: one JSON object per line on stdin, `{"env": {...}}`, answered by
`{"pid": n}` on stdout. At end of input every child still alive gets SIGTERM.
"""

import contextlib
import importlib
import os
import signal
import sys
from typing import Any

import orjson

# What `python -m server` imports before it serves, the lazily loaded parts too (the
# Redis backend, uvicorn's loop and protocols): a child then imports nothing.
PRELOAD = ("server.__main__", "server.backends.redis", "uvloop", "httptools",
           "uvicorn.loops.uvloop", "uvicorn.protocols.http.httptools_impl",
           "uvicorn.protocols.websockets.websockets_sansio_impl", "uvicorn.lifespan.on")


def child(env: dict[str, str]) -> None:
    """In the forked child: become `python -m server` with `env`; never returns."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # the parent's requests are not ours; the server's URL line
        os.dup2(devnull, fd)  # and warnings go nowhere, as with bench.common.server_process
    os.environ.clear()
    os.environ.update(env)
    code = 1
    try:
        import uuid

        from server import log_groups
        from server.__main__ import main

        # Drawn at import, so shared by every child of this process: instances on one
        # Redis then took each other's writes for repeats of their own (`same_write`).
        log_groups._PROCESS = uuid.uuid4().hex[:10]
        code = main()
    finally:
        os._exit(code)  # the parent's buffers and exit handlers are not the child's


def serve(requests: Any, answers: Any) -> None:
    children: list[int] = []
    for line in requests:
        if not line.strip():
            continue
        env = {str(k): str(v) for k, v in orjson.loads(line)["env"].items()}
        pid = os.fork()
        if pid == 0:
            child(env)
        children.append(pid)
        answers.write(orjson.dumps({"pid": pid}).decode() + "\n")
        answers.flush()
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)


def main() -> None:
    for name in PRELOAD:
        importlib.import_module(name)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    serve(sys.stdin, sys.stdout)


if __name__ == "__main__":
    main()
