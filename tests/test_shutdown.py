"""Graceful shutdown: SIGTERM ends this instance's runs and closes clients 1001."""

import asyncio
import signal

from bench.common import server_process
from tests.harness import SECRET, token, ws_client
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
