"""The test page as a developer console, in real headless Chromium: the event
inspector (filters, replayed badges, JSON, copy, run summaries), the
scenarios menu (each scripted run ends the way it should), settings, and the
document kept consistent across tabs of one browser.

The README's screenshot comes from here: `test-artifacts/page.png`, copied to
`docs/page.png` when `UPDATE_SCREENSHOTS=1` is set (so an ordinary test run
never dirties the work tree).
"""

import os
import re
import shutil

import orjson
import pytest

from tests.browser_support import (
    ROOT,
    NetworkCut,
    open_tab,
    pick_scenario,
    scripted,
    shot,
    submit,
)
from tests.harness import Server, joined

pytestmark = [pytest.mark.browser, pytest.mark.slow]

try:
    from playwright.async_api import Browser, Page, expect
except ImportError:  # pragma: no cover - the test extra installs it
    pass


async def visible_types(page: "Page") -> list[str]:
    cells = await page.locator("#ins-rows td.type").all_text_contents()
    return [c.removesuffix("replayed") for c in cells]


async def test_inspector_filters_and_marks_what_a_resume_replayed(
    browser: "Browser", dev_server: Server
) -> None:
    context = await browser.new_context(permissions=["clipboard-read", "clipboard-write"])
    text = "".join(f"[{i:03d}]" for i in range(60))
    async with NetworkCut(dev_server.settings.port) as network, \
            joined(dev_server, "c-inspect", sub="watcher", client_id="watch") as (watcher, _):
        tab = await open_tab(context, network, "c-inspect")
        page = tab.page
        await submit(page, scripted(text, chunk=5, delay_ms=15))
        await expect(page.locator(".msg.assistant").last).to_contain_text("[002]")
        # The network goes away: everything the run does until it finishes happens while
        # this tab cannot reconnect...
        network.cut()
        await watcher.recv_until("run.finished", timeout=15)
        await expect(page.locator("#status")).to_have_attribute("data-state", "reconnecting")
        # ...so all of it comes back as a replay when the network does.
        network.restore()
        await expect(page.locator("#status")).to_have_text("resumed", timeout=20_000)

        await expect(page.locator(".msg.notice").last).to_contain_text("run completed")
        assert await page.locator(".msg.assistant").last.text_content() == text
        replayed = page.locator("#ins-rows tr.replayed")
        await expect(replayed.last).to_contain_text("run.finished")
        await expect(replayed.last.locator(".badge")).to_have_text("replayed")
        live = page.locator("#ins-rows tr:not(.replayed)")
        await expect(live.filter(has_text="run.started")).to_have_count(1)  # before the drop

        await page.select_option("#ins-type", "run.finished")
        assert await visible_types(page) == ["run.finished"]
        await page.select_option("#ins-type", "!message.delta")
        types = await visible_types(page)
        assert "message.delta" not in types and "run.started" in types and "↑ run.start" in types
        await page.uncheck("#ins-sent")
        assert not any(t.startswith("↑") for t in await visible_types(page))
        await page.select_option("#ins-type", "")
        await page.select_option("#ins-run", index=1)
        run_cells = await page.locator("#ins-rows td.run").all_text_contents()
        assert run_cells and len(set(run_cells)) == 1 and run_cells[0].startswith("run_")

        # Click a row for its JSON; copy it.
        await page.locator("#ins-rows tr", has_text="run.finished").click()
        await expect(page.locator("#ins-detail-title")).to_contain_text("run.finished · seq")
        shown = orjson.loads(await page.locator("#ins-json").text_content() or "{}")
        assert shown["type"] == "run.finished" and shown["status"] == "completed"
        await page.click("#ins-copy")
        await expect(page.locator("#ins-copied")).to_have_text("copied 1 event as JSON")
        assert orjson.loads(await page.evaluate("navigator.clipboard.readText()")) == shown

        # The run's summary: one model call, completed, events counted with the replayed ones.
        summary = page.locator("#run-rows tr").first
        await expect(summary).to_contain_text("completed")
        cells = await summary.locator("td").all_text_contents()
        assert cells[2] == "1"  # steps
        assert re.fullmatch(r"\d+ \(\d+ replayed\)", cells[7]), cells[7]
        await shot(page, "inspector-replayed")
    await context.close()


async def test_inspector_pause_holds_the_table_and_resume_catches_up(
    browser: "Browser", dev_server: Server
) -> None:
    page = (await open_tab(browser, dev_server, "c-pause")).page
    await page.click("#ins-pause")
    before = await page.locator("#ins-rows tr").count()
    await submit(page, scripted("Short.", delay_ms=0))
    await expect(page.locator(".msg.notice").last).to_contain_text("run completed")
    await expect(page.locator("#ins-pause")).to_contain_text(re.compile(r"Resume \(\d+ new\)"))
    assert await page.locator("#ins-rows tr").count() == before
    await page.click("#ins-pause")
    await expect(page.locator("#ins-rows tr", has_text="run.finished")).to_have_count(1)


async def test_each_scenario_ends_the_way_it_should(browser: "Browser", dev_server: Server
                                                    ) -> None:
    tab = await open_tab(browser, dev_server, "c-scenarios", width=1300, height=1000)
    page = tab.page
    status = page.locator("#scenario-status")
    items = page.locator("#scenario-list .menu-item")
    await expect(page.locator("#status")).to_have_attribute("data-state", "open")
    features = await page.evaluate("window.cowrite.client.welcome.features ?? []")
    gated = ("edit_scope", "run_queue", "threads")  # 1.1 entries, one each
    await expect(items).to_have_count(6 + sum(name in features for name in gated))
    # "A workflow" needs a configured workflow too; a plain dev server has none, and the
    # Workflows menu says so.
    await expect(page.locator('[data-scenario="workflow"]')).to_have_count(0)
    if "workflows" in features:
        await page.click("#workflows summary")
        await expect(page.locator("#workflow-empty")).to_contain_text("No workflows configured")
        await page.click("#workflows summary")

    async def finished_as_expected(title: str) -> None:
        await expect(status).to_have_attribute("data-tone", "ok", timeout=15_000)
        await expect(status).to_have_text(re.compile(rf"^{title}: ended .*, as expected$"))

    await pick_scenario(page, "stream")
    await finished_as_expected("Streamed text")

    await pick_scenario(page, "client-tool")
    await finished_as_expected("Client tool")
    await expect(page.locator("#editor")).to_have_value(re.compile(r"client-tool scenario\)$"))

    await pick_scenario(page, "approval")
    await expect(page.locator("#approval")).to_be_visible()
    await page.click("#approve")
    await finished_as_expected("Approval")
    await expect(page.locator("#editor")).to_have_value(re.compile("^# Title from the approval"))
    await expect(page.locator("#tool-log li").last).to_contain_text("approved by tester")

    await pick_scenario(page, "abort")
    await expect(status).to_contain_text("Type in the document")
    await expect(page.locator(".msg.assistant").last).to_contain_text("Co-writing")
    await page.click("#editor")
    await page.keyboard.type("!")
    await finished_as_expected("Abort by typing")
    await expect(status).to_contain_text("aborted (document_changed)")

    await pick_scenario(page, "failure")
    await finished_as_expected("Upstream failure")
    await expect(page.locator(".msg.notice").last).to_contain_text("run failed (upstream_error)")

    await pick_scenario(page, "cancel")
    await expect(page.locator(".msg.assistant").last).to_contain_text("Co-wr")
    await expect(page.locator("#run-rows tr")).to_have_count(6)
    await page.select_option("#ins-type", "!message.delta")
    await page.locator("#ins-rows tr", has_text="run.started").last.click()
    screenshot = await shot(page, "page")  # mid-run: the README's picture
    if os.environ.get("UPDATE_SCREENSHOTS") == "1":
        (ROOT / "docs").mkdir(exist_ok=True)
        shutil.copyfile(screenshot, ROOT / "docs" / "page.png")
    await page.click("#cancel")
    await finished_as_expected("Slow stream to cancel")

    await expect(page.locator("#run-rows td:nth-child(2)", has_text="user_cancelled")
                 ).to_have_count(1)  # the summary catches up with the last event
    statuses = await page.locator("#run-rows td:nth-child(2)").all_text_contents()
    assert sorted(statuses) == sorted([
        "completed", "completed", "completed", "aborted (document_changed)",
        "failed (upstream_error)", "cancelled (user_cancelled)"])
    assert [p for p in tab.problems if "favicon" in p or "HTTP" in p] == []


async def test_tabs_of_one_browser_share_the_document(browser: "Browser", dev_server: Server
                                                      ) -> None:
    context = await browser.new_context()
    first = (await open_tab(context, dev_server, "c-tabs")).page
    second = (await open_tab(context, dev_server, "c-tabs")).page
    await pick_scenario(first, "client-tool")
    await expect(first.locator("#scenario-status")).to_contain_text("as expected")
    await expect(second.locator("#editor")).to_have_value(re.compile(r"client-tool scenario\)$"))

    await second.click("#editor")
    await second.keyboard.press("End")
    await second.keyboard.type(" Typed in the second tab.")
    await expect(first.locator("#editor")).to_have_value(
        re.compile(r"scenario\) Typed in the second tab\.$"))

    late = (await open_tab(context, dev_server, "c-tabs")).page  # asks the others on load
    shared = await first.locator("#editor").input_value()
    await expect(late.locator("#editor")).to_have_value(shared)
    other_doc = (await open_tab(context, dev_server, "c-tabs-other")).page
    await expect(other_doc.locator("#editor")).to_have_value(re.compile("^A short memo"))
    await context.close()


async def test_settings_switch_role_and_document(browser: "Browser", dev_server: Server) -> None:
    page = (await open_tab(browser, dev_server, "c-settings")).page
    await page.click("#open-settings")
    await page.fill("#set-doc", "no good")
    await expect(page.locator("#set-doc-error")).to_contain_text("contains a space")
    await page.click("#settings-save")
    await expect(page.locator("#settings")).to_be_visible()  # refused, nothing reloaded

    await page.fill("#set-doc", "c-settings-2")
    await page.fill("#set-user", "vera")
    await page.select_option("#set-role", "viewer")
    await page.click("#settings-save")
    await expect(page.locator("#doc-name")).to_have_text("c-settings-2")
    await expect(page.locator("#status")).to_have_attribute("data-state", "open")
    await expect(page.locator("#who")).to_contain_text("vera (viewer)")
    await expect(page.locator("#send")).to_be_disabled()
    assert await page.locator("#editor").evaluate("e => e.readOnly")
    welcome = page.locator("#ins-rows tr", has_text="welcome")
    await welcome.click()
    assert '"role": "viewer"' in (await page.locator("#ins-json").text_content() or "")

    await page.reload()  # the choice is remembered by this browser
    await expect(page.locator("#who")).to_contain_text("vera (viewer)")
