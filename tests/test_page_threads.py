"""The test page's workflows menu and thread switcher (protocol 1.1, section 14),
in real headless Chromium against a real server started with a config file that
defines two workflows. The frames the page sends are read off its WebSocket."""

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

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
    from playwright.async_api import Browser, Page, WebSocket, expect
except ImportError:  # pragma: no cover - the test extra installs it
    pass

WORKFLOWS_TOML = """
[[workflows]]
name = "tidy"
title = "Tidy up"
description = "Fix spelling and grammar."
category = "editing"
mode = "agent"
system_prompt = "You tidy."
tools = ["read_document"]
max_steps = 4

[[workflows]]
name = "ask"
title = "Ask a question"
description = "Answer without editing."
category = "chat"
mode = "chat"
"""


@pytest.fixture(name="workflow_server")
async def workflow_server_fixture(tmp_path: Path) -> AsyncIterator[Server]:
    path = tmp_path / "cowrite.toml"
    path.write_text(WORKFLOWS_TOML)
    async with running_server(config=path, dev=True) as srv:
        yield srv


def sent_frames(page: "Page") -> list[dict[str, Any]]:
    """Every JSON frame the page sends on its WebSockets from now on."""
    sent: list[dict[str, Any]] = []

    def on_socket(ws: "WebSocket") -> None:
        ws.on("framesent", lambda payload: sent.append(orjson.loads(payload)))

    page.on("websocket", on_socket)
    return sent


def run_starts(sent: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [m for m in sent if m.get("type") == "run.start"]


async def test_workflows_menu_lists_by_category_and_starts_runs_with_one(
    browser: "Browser", workflow_server: Server,
) -> None:
    tab = await open_tab(browser, workflow_server, "wf-menu", wait_open=False)
    page = tab.page
    sent = sent_frames(page)
    await page.reload()
    await expect(page.locator("#status")).to_have_attribute("data-state", "open")

    await page.click("#workflows summary")
    heads = page.locator("#workflow-list .menu-head")
    await expect(heads).to_have_text(["chat", "editing"])
    items = page.locator("#workflow-list [data-workflow]")
    await expect(items).to_have_count(2)
    await expect(items.first).to_contain_text("Ask a question")
    await expect(items.last).to_contain_text("Fix spelling and grammar.")
    await shot(page, "workflows-menu")
    await page.click('[data-workflow="tidy"]')
    await expect(page.locator("#workflow-chip")).to_be_visible()
    await expect(page.locator("#workflow-name")).to_have_text("Tidy up")

    await submit(page, scripted("Tidied."))
    await expect(page.locator(".msg.notice").last).to_contain_text("run completed")
    assert run_starts(sent)[-1]["workflow"] == "tidy"
    await expect(page.locator("#workflow-chip")).to_be_visible()  # until cleared

    await page.click("#workflow-clear")
    await expect(page.locator("#workflow-chip")).to_be_hidden()
    await submit(page, scripted("Plain."))
    await expect(page.locator(".msg.notice")).to_have_count(2)
    await expect(page.locator(".msg.notice").last).to_contain_text("run completed")
    assert "workflow" not in run_starts(sent)[-1]

    # The scenario uses the first workflow the server lists, whatever its name.
    await pick_scenario(page, "workflow")
    await expect(page.locator("#scenario-status")).to_contain_text("as expected",
                                                                  timeout=15_000)
    assert run_starts(sent)[-1]["workflow"] == "tidy"
    assert tab.problems == []


async def test_threads_keep_separate_transcripts_and_fold_other_threads(
    browser: "Browser", workflow_server: Server,
) -> None:
    tab = await open_tab(browser, workflow_server, "th-switch", wait_open=False)
    page = tab.page
    sent = sent_frames(page)
    await page.reload()
    await expect(page.locator("#status")).to_have_attribute("data-state", "open")
    await expect(page.locator("#thread")).to_have_value("main")

    await submit(page, scripted("Answer in main."))
    await expect(page.locator(".msg.notice").last).to_contain_text("run completed")
    assert run_starts(sent)[-1]["thread_id"] == "main"

    # A bad name is explained and changes nothing.
    await page.fill("#new-thread", "my ideas")
    await page.click("#new-thread-add")
    await expect(page.locator("#thread-error")).to_contain_text("letters, digits")
    await expect(page.locator("#thread")).to_have_value("main")

    await page.fill("#new-thread", "ideas")
    await page.click("#new-thread-add")
    await expect(page.locator("#thread")).to_have_value("ideas")
    await expect(page.locator("#thread-error")).to_have_text("")
    await expect(page.locator("#transcript .msg")).to_have_count(0)  # a new conversation
    await submit(page, scripted("Answer in ideas."))
    await expect(page.locator(".msg.notice").last).to_contain_text("run completed")
    assert run_starts(sent)[-1]["thread_id"] == "ideas"
    await expect(page.locator("#thread option")).to_have_text(["ideas · 1 run", "main · 1 run"])

    await page.select_option("#thread", "main")
    await expect(page.locator("#transcript .msg.assistant")).to_have_text(["Answer in main."])
    await page.select_option("#thread", "ideas")
    await expect(page.locator("#transcript .msg.assistant")).to_have_text(["Answer in ideas."])

    # A run of another thread (here: the "side" scenario) is shown folded and dimmed.
    await pick_scenario(page, "thread")
    await expect(page.locator("#scenario-status")).to_contain_text("as expected",
                                                                  timeout=15_000)
    assert run_starts(sent)[-1]["thread_id"] == "side"
    fold = page.locator("#transcript details.other-thread")
    await expect(fold).to_have_attribute("data-thread", "side")
    await expect(fold.locator("summary")).to_contain_text("completed")
    await expect(fold).not_to_have_attribute("open", "")
    await fold.locator("summary").click()
    await expect(fold).to_contain_text("Talking in the side thread.")
    await expect(page.locator("#transcript .msg.assistant")).to_have_text(["Answer in ideas."])

    # The thread is in the URL: a reload shows the same conversation.
    await page.reload()
    await expect(page.locator("#status")).to_have_attribute("data-state", "open")
    await expect(page.locator("#thread")).to_have_value("ideas")
    await expect(page.locator("#transcript .msg.assistant")).to_have_text(["Answer in ideas."])
    await shot(page, "threads")
    assert tab.problems == []
