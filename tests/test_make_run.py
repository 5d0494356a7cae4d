"""`make run` as a newcomer meets it: the port they ask for, one line of output
(the URL really served), a page at that URL, and a quiet Ctrl-C.

These run the real Makefile and the real `python -m server` in a subprocess.
"""

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
from pathlib import Path

import httpx
import pytest

from server.__main__ import browser_url
from tests.harness import free_port

ROOT = Path(__file__).resolve().parent.parent
MAKE = shutil.which("make")
pytestmark = pytest.mark.skipif(
    MAKE is None and os.environ.get("CI") != "true", reason="make is not installed"
)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in {"PORT", "HOST", "COWRITE_PORT", "COWRITE_HOST", "MAKEFLAGS", "MAKELEVEL"}}
    env.update(extra)
    return env


def dry_run(*args: str, **env: str) -> str:
    """The command `make run` would execute (make -n), with the given environment."""
    out = subprocess.run([MAKE or "make", "-n", "run", *args], cwd=ROOT, env=_env(**env),
                         capture_output=True, text=True, check=True).stdout
    return next(line for line in out.splitlines() if "-m server" in line)


def test_where_make_run_listens() -> None:
    assert "COWRITE_PORT=8000 " in dry_run() and "COWRITE_HOST=127.0.0.1 " in dry_run()
    assert "COWRITE_PORT=9000 " in dry_run(COWRITE_PORT="9000")
    assert "COWRITE_HOST=0.0.0.0 " in dry_run(COWRITE_HOST="0.0.0.0")
    assert "COWRITE_PORT=7000 " in dry_run(PORT="7000")
    assert "COWRITE_PORT=9000 " in dry_run(PORT="7000", COWRITE_PORT="9000")
    assert "COWRITE_PORT=6000 " in dry_run("PORT=6000", COWRITE_PORT="9000")
    assert "COWRITE_HOST=::1 " in dry_run("HOST=::1", HOST="0.0.0.0")


def test_browser_url() -> None:
    assert browser_url("127.0.0.1", ("127.0.0.1", 8123)) == "http://127.0.0.1:8123/"
    assert browser_url("", ("0.0.0.0", 8123)) == "http://127.0.0.1:8123/"  # every interface
    assert browser_url("0.0.0.0", ("0.0.0.0", 80)) == "http://127.0.0.1:80/"
    assert browser_url("::", ("::", 81, 0, 0)) == "http://[::1]:81/"
    assert browser_url("localhost", ("127.0.0.1", 82)) == "http://localhost:82/"


async def test_make_run_prints_the_url_it_serves_and_nothing_else() -> None:
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        MAKE or "make", "run", cwd=ROOT, env=_env(COWRITE_PORT=str(port)),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,  # its own process group, so Ctrl-C reaches make and python
    )
    assert process.stdout is not None
    try:
        line = (await asyncio.wait_for(process.stdout.readline(), 60)).decode()
        assert line.startswith("cowrite (dev, memory backend, scripted model) serving ")
        url = f"http://127.0.0.1:{port}/"
        assert line.rstrip().endswith(url)
        async with httpx.AsyncClient() as http:
            page = await http.get(url)
            icon = await http.get(f"{url}static/favicon.svg")
        assert page.status_code == 200 and "cowrite" in page.text
        assert icon.status_code == 200
    finally:
        os.killpg(process.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        try:
            rest = (await asyncio.wait_for(process.stdout.read(), 30)).decode()
            code = await asyncio.wait_for(process.wait(), 30)
        finally:  # whatever failed above, nothing of its process group outlives the test
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
    assert rest == "", f"make run printed more than its URL: {rest!r}"
    # make itself dies of the SIGINT it was sent (as in a terminal); the server exited cleanly,
    # which is why make printed no "*** [run] Interrupt" above.
    assert code in (0, -signal.SIGINT)
