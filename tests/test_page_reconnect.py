"""The test page across a dropped connection, where what happened while it was away
decides what it must do: a tool call that timed out meanwhile is not run, a run.start
whose ack was lost is asked again (not reported as failed), and typing while the page
reconnects still aborts the run. Real headless Chromium against real servers.
"""

import asyncio
import time

import orjson
import pytest

from tests.browser_support import NetworkCut, open_tab, submit
from tests.harness import Server, make_settings, running_server

pytestmark = [pytest.mark.browser, pytest.mark.slow]

try:
    from playwright.async_api import Browser, WebSocketRoute, expect
except ImportError:  # pragma: no cover - the test extra installs it
    pass


def script(*steps: dict[str, object], chunk: int = 2, delay_ms: int = 60) -> str:
    return orjson.dumps({"script": list(steps), "chunk_chars": chunk,
                         "delay_ms": delay_ms}).decode()


async def test_a_tool_call_that_timed_out_while_the_tab_was_away_is_not_run(
    browser: "Browser",
) -> None:
    settings = make_settings(dev=True, tool_timeout_s=2.0)
    marker = "[INSERTED BY A TIMED-OUT CALL]"
    async with running_server(settings), NetworkCut(settings.port) as cut:
        tab = await open_tab(browser, cut, "rc-timeout", extra="&keep=0")
        page = tab.page
        await submit(page, script(
            {"say": "Let me add a line slowly ",
             "tool_calls": [{"name": "insert_text", "arguments": {"text": marker}}]},
            {"say": "ok"}))
        await expect(page.locator(".msg.assistant").last).not_to_be_empty()
        cut.cut()  # the tool.call is sent while the tab is away, and times out
        await asyncio.sleep(4)
        cut.restore()
        await expect(page.locator("#status b")).to_have_text("resumed", timeout=20_000)
        await expect(page.locator("#transcript")).to_contain_text("run timed_out (tool_timeout)")
        await asyncio.sleep(0.5)  # a handler run from the replay would have edited by now
        assert marker not in await page.locator("#editor").input_value()
        await expect(page.locator("#transcript")).not_to_contain_text("run_not_active")


async def test_a_run_whose_ack_was_lost_goes_on_and_is_not_started_twice(
    browser: "Browser", dev_server: Server,
) -> None:
    page = await browser.new_page()
    page.set_default_timeout(15_000)
    armed = True

    def relay(ws: "WebSocketRoute") -> None:
        server = ws.connect_to_server()

        def from_server(message: str | bytes) -> None:
            nonlocal armed
            if armed and orjson.loads(message).get("type") == "ack" and \
                    orjson.loads(message).get("run_id"):
                armed = False  # the run.start arrived; its ack is lost with the connection
                asyncio.get_running_loop().create_task(ws.close(code=1012, reason="restart"))
                asyncio.get_running_loop().create_task(server.close())
                return
            ws.send(message)
        ws.on_message(lambda message: server.send(message))
        server.on_message(from_server)

    await page.route_web_socket("**/ws", relay)
    await page.goto(f"{dev_server.http}/?doc=rc-ack-{time.time_ns()}&user=tester&keep=0")
    await expect(page.locator("#status")).to_have_attribute("data-state", "open")
    await submit(page, script({"say": "An answer that was started. "}, chunk=3, delay_ms=30))
    await expect(page.locator("#status b")).to_have_text("resumed", timeout=20_000)
    await expect(page.locator(".msg.notice").last).to_contain_text("run completed")
    await expect(page.locator("#transcript")).not_to_contain_text("could not start")
    await expect(page.locator("#prompt")).to_have_value("")
    runs = await page.evaluate("""() => window.cowrite.inspector.records
        .filter((r) => ['run.start', 'run.started'].includes(r.type))
        .map((r) => `${r.dir} ${r.type} ${r.run}`)""")
    start = next(r for r in runs if r.startswith("out run.start "))
    run_id = start.split()[-1]
    # Asked again with the same run id (acked duplicate), and one run started.
    assert runs == [start, f"in run.started {run_id}", start] or \
        runs == [start, start, f"in run.started {run_id}"], runs
    await expect(page.locator(".msg.assistant")).to_have_count(1)
    assert await page.evaluate("[...window.cowrite.client.runScopes.keys()].length") == 0


async def test_typing_while_the_page_reconnects_during_a_run_aborts_it(
    browser: "Browser", dev_server: Server,
) -> None:
    async with NetworkCut(dev_server.settings.port) as cut:
        tab = await open_tab(browser, cut, "rc-typing", extra="&keep=0")
        page = tab.page
        await submit(page, script(
            {"say": "Reading slowly before I edit. ",
             "tool_calls": [{"name": "read_document", "arguments": {}}]},
            {"say": "Now inserting. ",
             "tool_calls": [{"name": "insert_text", "arguments": {"text": " [AGENT]"}}]},
            {"say": "done"}, chunk=2, delay_ms=80))
        await expect(page.locator(".msg.assistant").last).not_to_be_empty()
        cut.cut()
        await expect(page.locator("#status")).to_have_attribute("data-state", "reconnecting")
        await page.click("#editor")
        await page.keyboard.press("End")
        await page.keyboard.type(" typed offline")
        cut.restore()
        await expect(page.locator("#status b")).to_have_text("resumed", timeout=20_000)
        await expect(page.locator(".msg.notice").last).to_contain_text(
            "run aborted (document_changed)", timeout=20_000)
        assert (await page.locator("#editor").input_value()).endswith(" typed offline")
