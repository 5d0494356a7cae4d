"""A real `redis-server` per test, on a free port, in its own directory.

AOF with fsync on every write, so a restart keeps what was accepted (the
"Redis restarted mid-session" tests rely on it). In CI a missing binary
fails the run instead of skipping.
"""

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import redis.asyncio as aioredis

from tests.harness import free_port


def require_redis_server() -> str:
    binary = shutil.which("redis-server")
    if binary is None:
        if os.environ.get("CI") == "true":
            pytest.fail("redis-server is required in CI (.ci/run installs it)")
        pytest.skip("redis-server is not installed")
    return binary


@dataclass
class RedisProcess:
    binary: str
    port: int
    directory: str
    process: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def start(self) -> None:
        self.process = await asyncio.create_subprocess_exec(
            self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "yes", "--appendfsync", "always", "--dir", self.directory,
            "--daemonize", "no", "--loglevel", "warning",
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = aioredis.Redis(port=self.port)
        try:
            for _ in range(200):
                with contextlib.suppress(Exception):
                    if await client.ping():
                        return
                await asyncio.sleep(0.02)
            raise RuntimeError("redis-server did not answer PING")
        finally:
            await client.aclose()

    async def stop(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.process.wait(), 5)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()
        self.process = None

    async def discard(self) -> None:
        """Kill it: its data is about to be deleted. A SIGTERM waits for the server's next
        cron tick (up to 100 ms) before it exits; over a hundred Redis tests that adds up."""
        if self.process is not None and self.process.returncode is None:
            self.process.kill()
            await self.process.wait()
        self.process = None


@contextlib.asynccontextmanager
async def redis_process() -> AsyncIterator[RedisProcess]:
    binary = require_redis_server()
    with tempfile.TemporaryDirectory(prefix="cowrite-redis-") as directory:
        proc = RedisProcess(binary, free_port(), directory)
        await proc.start()
        try:
            yield proc
        finally:
            await proc.discard()
