"""The bundled test page in real headless Chromium against a real server:
the conversation, the editor tools, approvals, aborts, reconnects, and what
a newcomer meets first (no console errors, invalid document ids, refused
upgrades, a reload that keeps the text).

Screenshots land in test-artifacts/ for a person to look at.
"""

import re

import orjson
import pytest

from protocol.codes import CloseCode
from tests.browser_support import (
    open_tab,
    pick_scenario,
    scripted,
    shot,
    submit,
)
from tests.harness import Server, running_server

pytestmark = [pytest.mark.browser, pytest.mark.slow]

try:
    from playwright.async_api import Browser, expect
except ImportError:  # pragma: no cover - the test extra installs it
    pass


async def test_prompt_streams_text_into_the_transcript_without_console_errors(
    browser: "Browser", dev_server: Server
) -> None:
    tab = await open_tab(browser, dev_server, "b-stream")
    page = tab.page
    icon = await page.evaluate(
        "fetch(document.querySelector('link[rel~=icon]').href).then(r => r.status)")
    assert icon == 200
    await submit(page, scripted("Hello from the scripted model, streamed in small pieces."))
    await expect(page.locator(".msg.assistant").last).to_have_text(
        "Hello from the scripted model, streamed in small pieces.")
    await expect(page.locator(".msg.notice").last).to_contain_text("run completed")
    await expect(page.locator("#timings")).to_contain_text("first delta")
    await expect(page.locator("#timings")).to_contain_text("→ done")
    await shot(page, "stream")
    assert tab.problems == []


async def test_demo_run_edits_the_editor_through_tools(browser: "Browser", dev_server: Server
                                                       ) -> None:
    page = (await open_tab(browser, dev_server, "b-demo")).page
    await submit(page, "tidy up the memo")
    await expect(page.locator("#editor")).to_have_value(re.compile(r"cowrite: .tidy up the memo"))
    await expect(page.locator(".msg.notice").last).to_contain_text("run completed")
    await expect(page.locator("#tool-log li")).to_have_count(2)
    await expect(page.locator("#tool-log li").first).to_contain_text("read_document")
    await expect(page.locator("#tool-log li").nth(1)).to_contain_text("ok")
    await shot(page, "demo-edit")


async def test_typing_during_a_run_aborts_it_and_the_chip_says_aborted(
    browser: "Browser", dev_server: Server
) -> None:
    page = (await open_tab(browser, dev_server, "b-abort")).page
    await submit(page, scripted("This is a long answer. " * 40, chunk=2, delay_ms=20))
    await expect(page.locator(".msg.assistant").last).not_to_be_empty()
    await page.click("#editor")
    await page.keyboard.type("x")
    await expect(page.locator(".msg.notice").last).to_contain_text("run aborted (document_changed)")
    await expect(page.locator("#timings")).to_contain_text("→ aborted")
    await expect(page.locator("#timings")).not_to_contain_text("done")
    text = await page.locator(".msg.assistant").last.text_content()
    assert text and len(text) < len("This is a long answer. " * 40)
    await shot(page, "aborted")


async def test_approve_and_reject_in_the_dialog(browser: "Browser", dev_server: Server) -> None:
    page = (await open_tab(browser, dev_server, "b-approval")).page
    original = await page.locator("#editor").input_value()
    await submit(page, "rewrite with a title")
    dialog = page.locator("#approval")
    await expect(dialog).to_be_visible()
    await expect(page.locator("#approval-name")).to_have_text("replace_document")
    await shot(page, "approval-dialog")
    await page.click("#reject")
    await expect(page.locator(".msg.notice").last).to_contain_text("run completed")
    await expect(page.locator("#tool-log li").last).to_contain_text("rejected by tester")
    await expect(page.locator("#tool-log")).not_to_contain_text("rejectd")
    assert await page.locator("#editor").input_value() == original

    await submit(page, "rewrite with a title")
    await expect(dialog).to_be_visible()
    edited = orjson.loads(await page.locator("#approval-args").input_value())
    edited["text"] = "# Edited by the reviewer\n\n" + original
    await page.fill("#approval-args", orjson.dumps(edited).decode())
    await page.click("#approve")
    await expect(page.locator("#editor")).to_have_value(edited["text"])
    await expect(page.locator(".msg.notice").last).to_contain_text("run completed")
    await expect(page.locator("#tool-log li").last).to_contain_text("approved by tester")
    await shot(page, "approved")


async def test_cancel_button(browser: "Browser", dev_server: Server) -> None:
    page = (await open_tab(browser, dev_server, "b-cancel")).page
    await submit(page, scripted("Going on and on. " * 50, chunk=2, delay_ms=20))
    await expect(page.locator("#cancel")).to_be_enabled()
    await expect(page.locator(".msg.assistant").last).not_to_be_empty()
    await page.click("#cancel")
    await expect(page.locator(".msg.notice").last).to_contain_text("run cancelled (user_cancelled)")
    await expect(page.locator("#timings")).to_contain_text("→ cancelled")
    await expect(page.locator("#cancel")).to_be_disabled()


async def test_dropped_socket_reconnects_and_resumes_without_duplicates(
    browser: "Browser", dev_server: Server
) -> None:
    page = (await open_tab(browser, dev_server, "b-drop")).page
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
    page = (await open_tab(browser, dev_server, "b-narrow", width=390)).page
    await submit(page, scripted("Fits on a phone.", delay_ms=0))
    await expect(page.locator(".msg.assistant").last).to_have_text("Fits on a phone.")
    editor_box = await page.locator("#editor").bounding_box()
    prompt_box = await page.locator("#prompt").bounding_box()
    assert editor_box and prompt_box and editor_box["width"] <= 390
    assert prompt_box["y"] > editor_box["y"]  # stacked, not side by side
    await shot(page, "narrow")


async def test_an_invalid_document_id_is_explained_and_never_dialled(
    browser: "Browser", dev_server: Server
) -> None:
    tab = await open_tab(browser, dev_server, "my notes", wait_open=False)
    page = tab.page
    banner = page.locator("#banner")
    await expect(banner).to_be_visible()
    await expect(banner).to_contain_text("“my notes” cannot be opened")
    await expect(banner).to_contain_text("contains a space")
    await expect(page.locator("#status")).to_have_text("not connected")
    await expect(page.locator("#send")).to_be_disabled()
    await shot(page, "invalid-document")
    assert tab.sockets == [], "the page must not even try"
    assert tab.problems == []

    await page.get_by_role("button", name="Open “my-notes” instead").click()
    await expect(page.locator("#status")).to_have_attribute("data-state", "open")
    await expect(page.locator("#doc-name")).to_have_text("my-notes")
    await expect(banner).to_be_hidden()


async def test_a_refused_upgrade_stops_after_three_attempts_and_says_why(
    browser: "Browser"
) -> None:
    # An Origin the server does not allow: every upgrade is refused (HTTP 403), which the
    # browser reports only as close 1006 before open.
    async with running_server(dev=True, allowed_origins=["https://elsewhere.example"]) as srv:
        tab = await open_tab(browser, srv, "b-refused", wait_open=False)
        page = tab.page
        banner = page.locator("#banner")
        await expect(banner).to_contain_text("Could not connect", timeout=15_000)
        await expect(banner).to_contain_text("3 times in a row")
        await expect(page.locator("#status")).to_have_attribute("data-state", "closed")
        assert len(tab.sockets) == 3  # then it stopped: the client schedules nothing more
        await shot(page, "refused-upgrade")

        await page.get_by_role("button", name="Try again").click()
        await expect(banner).to_contain_text("Could not connect", timeout=15_000)
        assert len(tab.sockets) == 6


async def test_reload_keeps_the_text_the_transcript_talks_about(
    browser: "Browser", dev_server: Server
) -> None:
    page = (await open_tab(browser, dev_server, "b-reload")).page
    await pick_scenario(page, "client-tool")
    await expect(page.locator("#scenario-status")).to_contain_text("as expected")
    edited = await page.locator("#editor").input_value()
    assert edited.endswith("(added by the client-tool scenario)")
    version = await page.locator("#doc-version").text_content()

    await page.reload()
    await expect(page.locator("#status")).to_have_attribute("data-state", "open")
    await expect(page.locator(".msg.assistant").last).to_have_text(
        "Done: one read, one edit, both executed by this tab.")  # from the history
    await expect(page.locator("#editor")).to_have_value(edited)
    await expect(page.locator("#doc-version")).to_have_text(version or "")

    # With the setting off, this tab forgets the text: a reload shows the default memo.
    await page.click("#open-settings")
    await page.uncheck("#set-keep")
    await page.click("#settings-save")
    await page.reload()
    await expect(page.locator("#status")).to_have_attribute("data-state", "open")
    await expect(page.locator("#editor")).not_to_have_value(re.compile("client-tool scenario"))
    await expect(page.locator("#editor")).to_have_value(re.compile("^A short memo"))


async def test_without_dev_mode_the_page_says_why_it_cannot_connect(browser: "Browser") -> None:
    async with running_server(dev=False) as srv:
        tab = await open_tab(browser, srv, "b-nodev", wait_open=False)
        await expect(tab.page.locator("#banner")).to_contain_text(
            "Could not get a development token (POST /v1/dev/token answered HTTP 404)")
        await expect(tab.page.locator("#status")).to_have_attribute("data-state", "reconnecting")
        assert tab.sockets == []
