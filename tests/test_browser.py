"""The bundled test page in real headless Chromium (Debian's package, driven
by Playwright with `executable_path`) against a real server.

Screenshots land in test-artifacts/ for a person to look at.
"""

import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest

from protocol.codes import CloseCode
from tests.harness import Server, running_server

pytestmark = pytest.mark.browser
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
LAUNCH_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--no-first-run",
               "--disable-dev-shm-usage"]

try:
    from playwright.async_api import Browser, Page, async_playwright, expect
except ImportError:  # pragma: no cover - the test extra installs it
    async_playwright = None  # type: ignore[assignment]


def _require_browser() -> None:
    missing = async_playwright is None or not os.path.exists(CHROMIUM)
    if missing and os.environ.get("CI") == "true":
        pytest.fail("chromium and playwright are required in CI (.ci/run installs them)")
    if missing:
        pytest.skip("Debian's chromium or playwright is not installed")


@pytest.fixture
async def browser() -> AsyncIterator["Browser"]:
    _require_browser()
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        try:
            yield launched
        finally:
            await launched.close()


@pytest.fixture
async def dev_server() -> AsyncIterator[Server]:
    async with running_server(dev=True) as srv:
        yield srv


async def open_page(browser: "Browser", server: Server, doc: str, width: int = 1200) -> "Page":
    page = await browser.new_page(viewport={"width": width, "height": 900})
    page.set_default_timeout(10_000)
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    await page.goto(f"{server.http}/?doc={doc}&user=tester")
    await expect(page.locator("#status")).to_have_attribute("data-state", "open")
    page.errors = errors  # type: ignore[attr-defined]
    return page


async def shot(page: "Page", name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    await page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def scripted(text: str, chunk: int = 3, delay_ms: int = 15) -> str:
    return orjson.dumps({"script": [{"say": text}], "chunk_chars": chunk,
                         "delay_ms": delay_ms}).decode()


async def submit(page: "Page", prompt: str) -> None:
    await page.fill("#prompt", prompt)
    await page.click("#send")


async def test_prompt_streams_text_into_the_transcript(browser: "Browser", dev_server: Server
                                                       ) -> None:
    page = await open_page(browser, dev_server, "b-stream")
    await submit(page, scripted("Hello from the scripted model, streamed in small pieces."))
    await expect(page.locator(".msg.assistant").last).to_have_text(
        "Hello from the scripted model, streamed in small pieces.")
    await expect(page.locator(".msg.notice").last).to_contain_text("run completed")
    await expect(page.locator("#timings")).to_contain_text("first delta")
    await shot(page, "stream")
    assert page.errors == []  # type: ignore[attr-defined]


async def test_demo_run_edits_the_editor_through_tools(browser: "Browser", dev_server: Server
                                                       ) -> None:
    page = await open_page(browser, dev_server, "b-demo")
    await submit(page, "tidy up the memo")
    await expect(page.locator("#editor")).to_have_value(
        __import__("re").compile(r"cowrite: .tidy up the memo"))
    await expect(page.locator(".msg.notice").last).to_contain_text("run completed")
    await expect(page.locator("#tool-log li")).to_have_count(2)
    await expect(page.locator("#tool-log li").first).to_contain_text("read_document")
    await expect(page.locator("#tool-log li").nth(1)).to_contain_text("ok")
    await shot(page, "demo-edit")


async def test_typing_during_a_run_aborts_it(browser: "Browser", dev_server: Server) -> None:
    page = await open_page(browser, dev_server, "b-abort")
    await submit(page, scripted("This is a long answer. " * 40, chunk=2, delay_ms=20))
    await expect(page.locator(".msg.assistant").last).not_to_be_empty()
    await page.click("#editor")
    await page.keyboard.type("x")
    await expect(page.locator(".msg.notice").last).to_contain_text("run aborted (document_changed)")
    text = await page.locator(".msg.assistant").last.text_content()
    assert text and len(text) < len("This is a long answer. " * 40)
    await shot(page, "aborted")


async def test_approve_and_reject_in_the_dialog(browser: "Browser", dev_server: Server) -> None:
    page = await open_page(browser, dev_server, "b-approval")
    original = await page.locator("#editor").input_value()
    await submit(page, "rewrite with a title")
    dialog = page.locator("#approval")
    await expect(dialog).to_be_visible()
    await expect(page.locator("#approval-name")).to_have_text("replace_document")
    await shot(page, "approval-dialog")
    await page.click("#reject")
    await expect(page.locator(".msg.notice").last).to_contain_text("run completed")
    await expect(page.locator("#tool-log")).to_contain_text("rejected")
    assert await page.locator("#editor").input_value() == original

    await submit(page, "rewrite with a title")
    await expect(dialog).to_be_visible()
    edited = orjson.loads(await page.locator("#approval-args").input_value())
    edited["text"] = "# Edited by the reviewer\n\n" + original
    await page.fill("#approval-args", orjson.dumps(edited).decode())
    await page.click("#approve")
    await expect(page.locator("#editor")).to_have_value(edited["text"])
    await expect(page.locator(".msg.notice").last).to_contain_text("run completed")
    await shot(page, "approved")


async def test_cancel_button(browser: "Browser", dev_server: Server) -> None:
    page = await open_page(browser, dev_server, "b-cancel")
    await submit(page, scripted("Going on and on. " * 50, chunk=2, delay_ms=20))
    await expect(page.locator("#cancel")).to_be_enabled()
    await expect(page.locator(".msg.assistant").last).not_to_be_empty()
    await page.click("#cancel")
    await expect(page.locator(".msg.notice").last).to_contain_text("run cancelled (user_cancelled)")
    await expect(page.locator("#cancel")).to_be_disabled()


async def test_dropped_socket_reconnects_and_resumes_without_duplicates(
    browser: "Browser", dev_server: Server
) -> None:
    page = await open_page(browser, dev_server, "b-drop")
    text = "".join(f"[{i:03d}]" for i in range(120))
    await submit(page, scripted(text, chunk=5, delay_ms=15))
    await expect(page.locator(".msg.assistant").last).to_contain_text("[010]")
    for conn in list(dev_server.services.hub.get("b-drop").connections.values()):
        conn.close(CloseCode.GOING_AWAY, "test drop")
    await expect(page.locator("#status")).to_have_text("resumed", timeout=15_000)
    await expect(page.locator(".msg.notice").last).to_contain_text("run completed")
    await expect(page.locator(".msg.assistant")).to_have_count(1)
    assert await page.locator(".msg.assistant").last.text_content() == text
    await shot(page, "resumed")


async def test_narrow_layout(browser: "Browser", dev_server: Server) -> None:
    page = await open_page(browser, dev_server, "b-narrow", width=390)
    await submit(page, scripted("Fits on a phone.", delay_ms=0))
    await expect(page.locator(".msg.assistant").last).to_have_text("Fits on a phone.")
    editor_box = await page.locator("#editor").bounding_box()
    prompt_box = await page.locator("#prompt").bounding_box()
    assert editor_box and prompt_box and editor_box["width"] <= 390
    assert prompt_box["y"] > editor_box["y"]  # stacked, not side by side
    await shot(page, "narrow")
