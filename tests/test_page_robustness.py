"""The test page when things go wrong around it: tokens that expire or a server
that restarts with a new development secret, a tab that joins while a run streams,
a document over the frame limit, a run that moves to another instance, a queued run
cancelled under an open approval, a resume that fails, a duplicated tab and Escape
in the approval dialog. Real headless Chromium against real servers; the tests read
what a person sees (the DOM).
"""

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from tests.browser_support import NetworkCut, open_tab, pick_scenario, scripted, submit
from tests.cluster_support import instance
from tests.harness import Server, make_settings, running_server
from tests.redis_support import redis_process

pytestmark = [pytest.mark.browser, pytest.mark.slow]

try:
    from playwright.async_api import Browser, Page, Route, expect
except ImportError:  # pragma: no cover - the test extra installs it
    pass

FIRST_LINE = "A short memo about the quarterly offsite."


async def connected(page: "Page", timeout: float = 10_000) -> None:
    await expect(page.locator("#status")).to_have_attribute("data-state", "open", timeout=timeout)


async def slow_history(page: "Page", delay_s: float = 1.5) -> None:
    """The history's answer arrives `delay_s` late (a slow link): events come meanwhile."""
    async def late(route: "Route") -> None:
        response = await route.fetch()
        await asyncio.sleep(delay_s)
        await route.fulfill(response=response)
    await page.route("**/history*", late)


def transcript(page: "Page") -> Any:
    return page.locator("#transcript .msg")


@contextlib.asynccontextmanager
async def server_on(port: int, **overrides: Any) -> AsyncIterator[Server]:
    async with running_server(make_settings(dev=True, port=port, **overrides)) as srv:
        yield srv


# -- tokens -------------------------------------------------------------------------------


async def test_a_short_lived_token_is_replaced_before_it_expires(browser: "Browser",
                                                                 dev_server: Server) -> None:
    page = await browser.new_page()

    async def short_lived(route: "Route") -> None:
        body = orjson.loads(route.request.post_data or "{}")
        await route.continue_(post_data=orjson.dumps({**body, "ttl_s": 3}).decode())
    await page.route("**/v1/dev/token", short_lived)
    sockets: list[str] = []
    page.on("websocket", lambda ws: sockets.append(ws.url))
    await page.goto(f"{dev_server.http}/?doc=rb-token&user=tester&keep=0")
    await connected(page)
    await asyncio.sleep(7)  # two lifetimes of the first token
    await expect(page.locator("#status b")).to_have_text("connected")
    assert len(sockets) == 1, "the connection was never closed 4001"
    await submit(page, scripted("Still here."))
    await expect(transcript(page).last).to_contain_text("run completed")


async def test_a_server_restarted_with_a_new_dev_secret_is_joined_again(browser: "Browser") -> None:
    settings = make_settings(dev=True)
    async with running_server(settings) as first:
        tab = await open_tab(browser, first, "rb-restart", extra="&keep=0")
    # `make run` draws a new secret per process: the page's token no longer verifies.
    async with server_on(settings.port, jwt_secret="another-secret-0123456789abcdef0123"):
        await connected(tab.page, timeout=25_000)
        await submit(tab.page, scripted("Back."))
        await expect(transcript(tab.page).last).to_contain_text("run completed")


# -- joining while a run streams -------------------------------------------------------------


async def test_a_tab_that_joins_mid_run_shows_what_came_while_it_loaded(
    browser: "Browser", dev_server: Server,
) -> None:
    alice = (await open_tab(browser, dev_server, "rb-join", user="alice", extra="&keep=0")).page
    # Long enough (~4 s) for bob's page to load and connect while it runs, on a busy CI
    # host too (at 1 s it had sometimes ended before bob's welcome: nothing to join).
    await submit(alice, scripted("THE ANSWER that lasts a few seconds.", chunk=4, delay_ms=400))
    await expect(alice.locator("#run-state")).to_contain_text("running")
    context = await browser.new_context()  # another browser: bob
    bob = await context.new_page()
    await slow_history(bob)
    await bob.goto(f"{dev_server.http}/?doc=rb-join&user=bob&keep=0")
    await expect(bob.locator("#run-state")).to_contain_text("running")  # joined mid-run
    await expect(alice.locator("#run-state")).to_have_text("", timeout=15_000)
    await expect(transcript(bob)).to_have_text(await transcript(alice).all_text_contents(),
                                               timeout=5_000)
    await expect(bob.locator("#run-state")).to_have_text("")
    await expect(bob.locator("#send")).to_be_enabled()
    await context.close()


async def test_a_reload_during_a_run_still_asks_for_the_approval(browser: "Browser",
                                                                 dev_server: Server) -> None:
    page = (await open_tab(browser, dev_server, "rb-reload", extra="&keep=0")).page
    await submit(page, orjson.dumps({"chunk_chars": 3, "delay_ms": 40, "script": [
        {"say": "Streaming a little before asking for approval... ",
         "tool_calls": [{"name": "replace_document", "arguments": {"text": "# New title"}}]},
        {"say": "done."}]}).decode())
    await expect(page.locator("#transcript")).to_contain_text("Streaming")
    await slow_history(page)
    await page.reload()
    await expect(page.locator("#approval")).to_be_visible()
    await page.click("#approve")
    await expect(transcript(page).last).to_contain_text("run completed")
    await expect(page.locator("#editor")).to_have_value("# New title")


# -- size --------------------------------------------------------------------------------------


async def test_a_document_over_the_frame_limit_is_refused_and_the_tab_stays_connected(
    browser: "Browser", dev_server: Server,
) -> None:
    tab = await open_tab(browser, dev_server, "rb-big", extra="&keep=0")
    page = tab.page
    limit = await page.evaluate("window.cowrite.client.welcome.limits.max_message_bytes")
    big = "lorem ipsum dolor sit amet. " * (limit // 28 + 100)
    await page.locator("#editor").evaluate(
        "(area, text) => { area.value = text; area.dispatchEvent(new Event('input')); }", big)
    await submit(page, "tidy up")
    await expect(transcript(page).last).to_contain_text(
        "the request (prompt + document) is too large for a run")
    await page.fill("#editor", "Short again.")
    await submit(page, scripted("Fits."))
    await expect(transcript(page).last).to_contain_text("run completed")
    await expect(page.locator("#status b")).to_have_text("connected")
    assert len(tab.sockets) == 1
    assert tab.problems == []


async def test_a_prompt_over_the_frame_limit_is_not_blamed_on_the_document(
    browser: "Browser",
) -> None:
    async with running_server(make_settings(dev=True, max_message_bytes=8000)) as srv:
        tab = await open_tab(browser, srv, "rb-long-prompt", extra="&keep=0")
        page = tab.page
        await page.fill("#editor", "Short.")
        await submit(page, "please " * 1500)  # about 10 kB of prompt, 6 bytes of document
        await expect(transcript(page).last).to_contain_text(
            "the request (prompt + document) is too large for a run")
        await expect(transcript(page).last).not_to_contain_text("document too large")
        assert await page.locator("#prompt").input_value() == "please " * 1500  # kept to edit
        await expect(page.locator("#status b")).to_have_text("connected")
        assert tab.problems == []


# -- a run that moves to another instance (Redis) --------------------------------------------


async def test_a_discarded_message_is_not_shown_twice(browser: "Browser") -> None:
    text = "ONE two three four five six seven eight nine ten eleven twelve thirteen fourteen."
    async with redis_process() as redis, instance(redis, {"COWRITE_DEV": "1"}) as a, \
            instance(redis, {"COWRITE_DEV": "1"}) as b, \
            NetworkCut(a.port) as to_a, NetworkCut(b.port) as to_b:  # (only to have their URLs)
        watcher = (await open_tab(browser, to_b, "rb-discard", user="bob", extra="&keep=0")).page
        context = await browser.new_context()
        starter = (await open_tab(context, to_a, "rb-discard", user="alice", extra="&keep=0")).page
        await submit(starter, scripted(text, chunk=3, delay_ms=80))
        streaming = "[...document.querySelectorAll('#transcript .msg.assistant')]" \
            ".some(e => e.textContent.length > 20)"
        await watcher.wait_for_function(streaming)
        a.process.send_signal(signal.SIGTERM)  # a drain: b takes the run over
        await expect(transcript(watcher).last).to_contain_text("run completed", timeout=30_000)
        await expect(watcher.locator("#transcript .msg.assistant")).to_have_text([text])
        await context.close()


# -- queued runs and approvals -----------------------------------------------------------------


async def test_cancelling_a_queued_run_leaves_the_active_runs_approval_alone(
    browser: "Browser", dev_server: Server,
) -> None:
    dave_tab = await open_tab(browser, dev_server, "rb-queue", user="dave", extra="&keep=0")
    dave = dave_tab.page
    if "run_queue" not in await dave.evaluate("window.cowrite.client.welcome.features ?? []"):
        pytest.skip("the server does not announce run_queue")
    await pick_scenario(dave, "approval")
    await expect(dave.locator("#approval")).to_be_visible()
    context = await browser.new_context()
    erin = (await open_tab(context, dev_server, "rb-queue", user="erin", extra="&keep=0")).page
    ack = await erin.evaluate("""() => window.cowrite.client.startRun({prompt: 'queued one',
        ifBusy: 'enqueue', context: {document: {text: 'x', version: 0}}})""")
    assert ack["status"] == "queued"
    await expect(dave.locator("#queue li")).to_have_count(1)
    await erin.evaluate("id => window.cowrite.client.cancelRun(id, 'changed my mind')",
                        ack["run_id"])
    await expect(dave.locator("#queue-box")).to_be_hidden()
    await asyncio.sleep(0.3)
    await expect(dave.locator("#approval")).to_be_visible()
    await expect(dave.locator("#transcript .notice")).to_have_count(0)
    await expect(dave.locator("#timings")).not_to_contain_text("cancelled")
    await dave.click("#approve")
    await expect(dave.locator("#scenario-status")).to_contain_text("as expected")
    assert dave_tab.problems == []
    await context.close()


async def test_escape_does_not_lose_the_approval(browser: "Browser", dev_server: Server) -> None:
    tab = await open_tab(browser, dev_server, "rb-escape", extra="&keep=0")
    page = tab.page
    await pick_scenario(page, "approval")
    await expect(page.locator("#approval")).to_be_visible()
    await page.keyboard.press("Escape")
    await page.keyboard.press("Escape")  # a second one closes it whatever the page says
    await page.locator("#approval").evaluate("dialog => dialog.close()")
    await page.click("#tool-log .answer")
    await page.click("#approve")
    await expect(page.locator("#scenario-status")).to_contain_text("as expected")
    assert tab.problems == []


# -- a resume that fails -------------------------------------------------------------------------


async def test_after_a_failed_resume_nothing_of_the_lost_run_is_left(browser: "Browser") -> None:
    settings = make_settings(dev=True)
    async with NetworkCut(settings.port) as cut:
        async with running_server(settings):
            page = (await open_tab(browser, cut, "rb-lost", extra="&keep=0")).page
            await page.check("#scoped")
            await page.locator("#editor").evaluate(
                f"area => area.setSelectionRange(0, {len(FIRST_LINE)})")
            await submit(page, "rewrite with a title")  # a scoped run that asks for approval
            await expect(page.locator("#approval")).to_be_visible()
            await expect(page.locator("#scope-backdrop mark")).to_have_text(FIRST_LINE)
            cut.cut()
        # The server went with the run and its log (memory backend); a new one comes up.
        async with server_on(settings.port):
            cut.restore()
            await connected(page, timeout=25_000)
            await expect(page.locator("#approval")).to_be_hidden()
            await expect(page.locator("#scope-backdrop mark")).to_have_count(0)
            await expect(page.locator("#tool-log li")).to_contain_text(["lost"])
            await expect(page.locator("#run-state")).to_have_text("")
            await submit(page, scripted("A new run."))
            await expect(transcript(page).last).to_contain_text("run completed")


# -- a duplicated tab ------------------------------------------------------------------------------


async def test_a_duplicated_tab_takes_its_own_client_id(browser: "Browser",
                                                        dev_server: Server) -> None:
    context = await browser.new_context()
    first_tab = await open_tab(context, dev_server, "rb-dup")
    first = first_tab.page
    stored = await first.evaluate("JSON.stringify(Object.assign({}, sessionStorage))")
    copy = await context.new_page()
    # What "Duplicate tab" does: the new tab starts with a copy of sessionStorage.
    await copy.add_init_script(f"""if (!sessionStorage.getItem("dup")) {{
        const s = {stored}; for (const k in s) sessionStorage.setItem(k, s[k]);
        sessionStorage.setItem("dup", "1"); }}""")
    await copy.goto(f"{dev_server.http}/?doc=rb-dup&user=tester")
    await connected(copy)
    ids = [await p.evaluate("window.cowrite.client.clientId") for p in (first, copy)]
    assert ids[0] != ids[1]
    await expect(copy.locator("#who")).to_contain_text(ids[1])
    await copy.fill("#editor", "typed in the duplicate")
    await expect(first.locator("#editor")).to_have_value("typed in the duplicate")
    assert first_tab.problems == []
    await context.close()
