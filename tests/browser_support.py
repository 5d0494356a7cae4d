"""Headless Chromium (Debian's package, driven by Playwright with
`executable_path`, never `playwright install`) against a real server.

`open_tab` records what a person with the developer tools open would notice:
uncaught page errors, console errors and HTTP responses >= 400 (a missing
favicon among them). Screenshots land in test-artifacts/.
"""

import asyncio
import os
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import orjson
import pytest

from tests.harness import Server, running_server

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"
LAUNCH_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--no-first-run",
               "--disable-dev-shm-usage"]

try:
    from playwright.async_api import (
        Browser,
        BrowserContext,
        ConsoleMessage,
        Page,
        Response,
        async_playwright,
        expect,
    )
except ImportError:  # pragma: no cover - the test extra installs it
    async_playwright = None  # type: ignore[assignment]


def require_browser() -> None:
    missing = async_playwright is None or not os.path.exists(CHROMIUM)
    if missing and os.environ.get("CI") == "true":
        pytest.fail("chromium and playwright are required in CI (.ci/run installs them)")
    if missing:
        pytest.skip("Debian's chromium or playwright is not installed")


# Fixtures under other names, so that test modules can import them (`from
# tests.browser_support import browser_fixture`) without their parameters
# shadowing the import.
@pytest.fixture(name="browser")
async def browser_fixture() -> AsyncIterator["Browser"]:
    require_browser()
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        try:
            yield launched
        finally:
            await launched.close()


@pytest.fixture(name="dev_server")
async def dev_server_fixture() -> AsyncIterator[Server]:
    async with running_server(dev=True) as srv:
        yield srv


@dataclass
class Tab:
    """A page and what went wrong in it, as the developer tools would show."""

    page: "Page"
    problems: list[str] = field(default_factory=list)
    sockets: list[str] = field(default_factory=list)  # every WebSocket the page opened


async def open_tab(
    target: "Browser | BrowserContext", server: "Server | NetworkCut", doc: str, *,
    width: int = 1200,
    height: int = 900, user: str = "tester", extra: str = "", wait_open: bool = True,
) -> Tab:
    page = await target.new_page()
    await page.set_viewport_size({"width": width, "height": height})
    page.set_default_timeout(10_000)
    tab = Tab(page)

    def on_console(message: "ConsoleMessage") -> None:
        if message.type == "error":
            tab.problems.append(f"console: {message.text}")

    def on_response(response: "Response") -> None:
        if response.status >= 400:
            tab.problems.append(f"HTTP {response.status} {response.url}")

    page.on("pageerror", lambda error: tab.problems.append(f"page error: {error}"))
    page.on("console", on_console)
    page.on("response", on_response)
    page.on("websocket", lambda ws: tab.sockets.append(ws.url))
    await page.goto(f"{server.http}/?doc={quote(doc)}&user={user}{extra}")
    if wait_open:
        await expect(page.locator("#status")).to_have_attribute("data-state", "open")
    return tab


async def shot(page: "Page", name: str, full_page: bool = True) -> Path:
    """A screenshot artifact. Playwright's default 10 s ran out once on a loaded CI host
    (a page streaming text mid-run), failing a test whose checks had all passed: 30 s."""
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    await page.screenshot(path=str(path), full_page=full_page, timeout=30_000)
    return path


def scripted(text: str, chunk: int = 3, delay_ms: int = 15, **extra: Any) -> str:
    return orjson.dumps({"script": [{"say": text, **extra}], "chunk_chars": chunk,
                         "delay_ms": delay_ms}).decode()


async def submit(page: "Page", prompt: str) -> None:
    await page.fill("#prompt", prompt)
    await page.click("#send")


async def pick_scenario(page: "Page", scenario: str) -> None:
    await page.click("#scenarios summary")
    await page.click(f'[data-scenario="{scenario}"]')


class NetworkCut:
    """A TCP proxy in front of a server whose network the test can cut.

    `cut()` closes every proxied connection at once and refuses new ones (they
    are accepted and closed, so a browser sees its upgrade fail); `restore()`
    lets them through again. Unlike browser offline emulation, nothing can
    slip through between the two, so "what happened while the tab was cut
    off" is exactly defined.
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.refusing = False
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> "NetworkCut":
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def cut(self) -> None:
        self.refusing = True
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    def restore(self) -> None:
        self.refusing = False

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.refusing:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.transport.abort()
            return
        self._writers.update((writer, up_writer))
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            self._writers.discard(writer)
            writer.transport.abort()
