"""Graceful shutdown: SIGTERM ends this instance's runs and closes clients 1001."""

import asyncio
import signal
import subprocess
import sys

from bench.common import Proc, server_env, server_process, wait_ready
from tests.harness import SECRET, free_port, token, ws_client
from tests.runs import script


async def test_sigterm_aborts_runs_and_closes_with_1001() -> None:
    async with server_process("cowrite", COWRITE_JWT_SECRET=SECRET) as proc:
        async with ws_client(proc.url("/v1/documents/doc-1/ws")) as client, \
                ws_client(proc.url("/v1/documents/doc-1/ws")) as watcher:
            for who, c in (("alice", client), ("bob", watcher)):
                await c.send({"type": "hello", "protocol": 1, "client_id": who,
                              "token": token(who)})
                await c.recv_until("welcome")
            await client.send({"type": "run.start", "prompt": script(
                {"say": "x" * 500}, chunk_chars=1, delay_ms=20)})
            await watcher.recv_until("message.delta")
            proc.process.send_signal(signal.SIGTERM)
            finished = await watcher.recv_until("run.finished")
            assert finished["status"] == "aborted" and finished["reason"] == "server_shutdown"
            assert await watcher.expect_close() == 1001
            assert await client.expect_close() == 1001
        await asyncio.wait_for(proc.process.wait(), 10)
        # uvicorn re-raises the captured SIGTERM once shut down: a clean, signalled exit
        assert proc.process.returncode in (0, -signal.SIGTERM)


async def test_sigterm_exports_the_spans_still_waiting() -> None:
    """Ended spans wait for the exporting thread (up to OTEL_BSP_SCHEDULE_DELAY); its
    flush at exit never ran, since uvicorn ends a SIGTERM by the signal itself."""
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "server", stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        env=server_env(port, COWRITE_JWT_SECRET=SECRET, COWRITE_OTEL="1",
                       COWRITE_OTEL_EXPORTER="console", OTEL_BSP_SCHEDULE_DELAY="600000"))
    try:
        proc = Proc(process, port)
        await wait_ready(proc)
        async with ws_client(proc.url("/v1/documents/doc-1/ws")) as client:
            await client.send({"type": "hello", "protocol": 1, "client_id": "alice",
                               "token": token("alice")})
            await client.recv_until("welcome")
            await client.send({"type": "run.start", "id": "s", "prompt": script({"say": "hi"})})
            run_id = (await client.recv_until("run.finished"))["run_id"]
        process.send_signal(signal.SIGTERM)
        printed, _ = await asyncio.wait_for(process.communicate(), 20)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    text = printed.decode()
    assert '"name": "cowrite.run"' in text and run_id in text
