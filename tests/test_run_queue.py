"""Several runs asked for at once (PROTOCOL.md section 12) over real sockets: the queue
(order, welcome, cancel, bound), interrupt, the default, and a queue shared by two
instances through a real redis-server."""

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest

from server.backends.base import BackendUnavailable, LoggedEvent
from tests.harness import Client, Server, joined, running_server
from tests.redis_support import redis_process
from tests.runs import answer, call, of_run, script, start

WAITS = script({"tool_calls": [call("read_document")]}, {"say": "done"})


async def enqueue(client: Client, prompt: str, run_id: str, **options: Any) -> dict[str, Any]:
    return await start(client, prompt, run_id=run_id,
                       options={"if_busy": "enqueue", **options})


def finished(run_id: str) -> Any:
    return lambda e: e.get("type") == "run.finished" and e.get("run_id") == run_id


async def test_runs_wait_in_order_and_welcome_lists_them(server: Server) -> None:
    async with joined(server) as (alice, welcome), \
            joined(server, sub="bob", client_id="b") as (bob, _), \
            joined(server, sub="carol", client_id="c") as (carol, _):
        assert "run_queue" in welcome["features"]
        await start(alice, WAITS, run_id="a-1")
        tool_call = await alice.recv_until("tool.call")
        queued_b = await enqueue(bob, script({"say": "bob"}), "b-1")
        queued_c = await enqueue(carol, script({"say": "carol"}), "c-1")
        assert queued_b["status"] == queued_c["status"] == "queued"
        announced = [await alice.recv_until("run.queued"), await alice.recv_until("run.queued")]
        assert [(e["run_id"], e["position"], e["user_id"]) for e in announced] == [
            ("b-1", 1, "bob"), ("c-1", 2, "carol")]
        async with joined(server, sub="dave", client_id="d") as (_, late):
            assert [(r["run_id"], r["status"]) for r in late["queued_runs"]] == [
                ("b-1", "queued"), ("c-1", "queued")]
        await answer(alice, tool_call, {"text": "doc"})
        for run_id in ("a-1", "b-1", "c-1"):
            assert (await alice.recv_until(finished(run_id)))["status"] == "completed"
        started = [e["run_id"] for e in alice.events if e.get("type") == "run.started"]
        assert started == ["a-1", "b-1", "c-1"]
        assert of_run(alice.events, "b-1", "run.started")[0]["seq"] > \
            of_run(alice.events, "a-1", "run.finished")[0]["seq"]


async def test_an_answer_for_a_queued_run_says_it_has_not_started(server: Server) -> None:
    async with joined(server) as (alice, _), joined(server, sub="bob", client_id="b") as (bob, _):
        await start(alice, WAITS, run_id="a-q")
        await alice.recv_until("tool.call")
        await enqueue(bob, WAITS, "b-q")
        await bob.send({"type": "approval", "id": "early", "run_id": "b-q", "call_id": "c",
                        "decision": "approve"})
        refused = await bob.recv_until(lambda e: e.get("reply_to") == "early")
        assert refused["code"] == "run_not_active"  # it said the run "has finished"
        assert refused["message"] == "run 'b-q' is queued: it has not started"


async def test_cancel_of_a_queued_run_ends_it_unstarted(server: Server) -> None:
    async with joined(server) as (alice, _), joined(server, sub="bob", client_id="b") as (bob, _):
        await start(alice, WAITS, run_id="a-2")
        tool_call = await alice.recv_until("tool.call")
        await enqueue(bob, script({"say": "never"}), "b-2")
        await alice.send({"type": "run.cancel", "id": "x", "run_id": "b-2"})
        assert (await alice.recv_until(lambda e: e.get("reply_to") == "x"))["code"] == \
            "forbidden"
        await bob.send({"type": "run.cancel", "id": "c", "run_id": "b-2"})
        ended = await bob.recv_until(finished("b-2"))
        assert (ended["status"], ended["reason"], ended["steps"]) == (
            "cancelled", "user_cancelled", 0)
        assert (await bob.recv_until(lambda e: e.get("reply_to") == "c"))["status"] == \
            "cancelled"
        await answer(alice, tool_call, {"text": "doc"})
        await alice.recv_until(finished("a-2"))
        await alice.send({"type": "ping", "ts": 1})
        await alice.recv_until("pong")
        assert not of_run(alice.events, "b-2", "run.started")


async def test_a_queued_run_shows_its_workflows_mode(tmp_path: Path) -> None:
    """A chat workflow's run queued with the default `mode` was listed as `agent` in
    `welcome.queued_runs`, then started as `chat`."""
    config = tmp_path / "cowrite.toml"
    config.write_text('[[workflows]]\nname = "ask"\ntitle = "Ask"\nmode = "chat"\n')
    async with running_server(config=config) as srv, joined(srv) as (alice, _), \
            joined(srv, sub="bob", client_id="b") as (bob, _):
        await start(alice, WAITS, run_id="a-1")
        tool_call = await alice.recv_until("tool.call")
        await start(bob, script({"say": "bob"}), run_id="b-1", workflow="ask",
                    options={"if_busy": "enqueue"})
        async with joined(srv, sub="dave", client_id="d") as (_, late):
            assert [(r["run_id"], r["mode"]) for r in late["queued_runs"]] == [("b-1", "chat")]
        await answer(alice, tool_call, {"text": "doc"})
        started = await alice.recv_until(lambda e: e.get("type") == "run.started"
                                         and e.get("run_id") == "b-1")
        assert started["mode"] == "chat"


async def test_the_queue_is_bounded_and_reject_stays_the_default() -> None:
    async with running_server(max_queued_runs=1) as srv, joined(srv) as (alice, _), \
            joined(srv, sub="bob", client_id="b") as (bob, _):
        await start(alice, WAITS, run_id="a-3")
        await alice.recv_until("tool.call")
        await bob.send({"type": "run.start", "id": "plain", "prompt": "p"})
        assert (await bob.recv_until(lambda e: e.get("reply_to") == "plain"))["code"] == \
            "document_busy"
        await enqueue(bob, script({"say": "one"}), "b-3")
        await bob.send({"type": "run.start", "id": "full", "prompt": "p",
                        "options": {"if_busy": "enqueue"}})
        full = await bob.recv_until(lambda e: e.get("reply_to") == "full")
        assert full["code"] == "document_busy" and "at most 1" in full["message"]


async def test_interrupt_ends_the_other_run_and_can_be_switched_off() -> None:
    async with running_server() as srv, joined(srv) as (alice, _), \
            joined(srv, sub="bob", client_id="b") as (bob, _):
        await start(alice, WAITS, run_id="a-4")
        await alice.recv_until("tool.call")
        ack = await start(bob, script({"say": "mine now"}), run_id="b-4",
                          options={"if_busy": "interrupt"})
        assert ack["status"] == "running"
        ended = await alice.recv_until(finished("a-4"))
        assert (ended["status"], ended["reason"]) == ("cancelled", "interrupted")
        assert (await bob.recv_until(finished("b-4")))["status"] == "completed"
    async with running_server(allow_interrupt=False) as srv, joined(srv) as (alice, _), \
            joined(srv, sub="bob", client_id="b") as (bob, _):
        await start(alice, WAITS, run_id="a-5")
        await alice.recv_until("tool.call")
        await bob.send({"type": "run.start", "id": "i", "prompt": "p",
                        "options": {"if_busy": "interrupt"}})
        assert (await bob.recv_until(lambda e: e.get("reply_to") == "i"))["code"] == "forbidden"


async def test_a_queued_run_that_cannot_start_still_ends(server: Server) -> None:
    """The backend is down just when a queued run's turn comes: its start cannot be
    logged, so it ends `failed`/`unavailable` once the backend is back (README,
    Decisions), and the run queued after it starts then."""
    backend = server.services.backend
    append = backend.append
    outage: list[float] = []  # when the outage began (it lasts half a second)

    async def flaky_append(document_id: str, event: dict[str, Any]) -> LoggedEvent:
        loop = asyncio.get_running_loop()
        if not outage and event["type"] == "run.started" and event["run_id"] == "b-8":
            outage.append(loop.time())
        if outage and loop.time() - outage[0] < 0.5:
            raise BackendUnavailable("redis: connection refused")
        return await append(document_id, event)

    async with joined(server) as (alice, _), joined(server, sub="bob", client_id="b") as (bob, _), \
            joined(server, sub="carol", client_id="c") as (carol, _):
        await start(alice, WAITS, run_id="a-8")
        tool_call = await alice.recv_until("tool.call")
        await enqueue(bob, script({"say": "never"}), "b-8")
        await enqueue(carol, script({"say": "carol"}), "c-8")
        backend.append = flaky_append  # type: ignore[method-assign]
        # the session's in-process shortcut bypasses `append`: the outage needs the
        # general path (the one a Redis backend takes)
        server.services.hub.sessions["doc-1"]._append_encoded = None
        await answer(alice, tool_call, {"text": "doc"})
        assert (await alice.recv_until(finished("a-8")))["status"] == "completed"
        unstarted = await bob.recv_until(finished("b-8"), timeout=10)
        assert (unstarted["status"], unstarted["reason"], unstarted["steps"]) == (
            "failed", "unavailable", 0)
        assert unstarted["error"]["code"] == "unavailable" and outage
        assert (await carol.recv_until(finished("c-8"), timeout=10))["status"] == "completed"
        assert not of_run(bob.events, "b-8", "run.started")
        assert len(of_run(bob.events, "b-8", "run.finished")) == 1
        started = await bob.recv_until(lambda e: e.get("type") == "run.started"
                                       and e.get("run_id") == "c-8")
        assert started["seq"] > unstarted["seq"]
        await bob.send({"type": "run.start", "id": "again", "run_id": "b-8", "prompt": "p",
                        "options": {"if_busy": "enqueue"}})
        retry = await bob.recv_until(lambda e: e.get("reply_to") == "again")
        assert (retry["status"], retry["duplicate"]) == ("failed", True)


@pytest.mark.redis
async def test_the_queue_is_shared_by_two_instances() -> None:
    async with redis_process() as redis, contextlib.AsyncExitStack() as stack:
        one = await stack.enter_async_context(running_server(redis_url=redis.url))
        two = await stack.enter_async_context(running_server(redis_url=redis.url))
        alice, _ = await stack.enter_async_context(joined(one))
        bob, _ = await stack.enter_async_context(joined(two, sub="bob", client_id="b"))
        await start(alice, WAITS, run_id="a-6")
        tool_call = await alice.recv_until("tool.call")
        queued = await enqueue(bob, script({"say": "from two"}), "b-6")
        assert queued["status"] == "queued"
        async with joined(one, sub="carol", client_id="c") as (_, welcome):
            assert [r["run_id"] for r in welcome["queued_runs"]] == ["b-6"]
        await answer(alice, tool_call, {"text": "doc"})
        assert (await bob.recv_until(finished("a-6")))["status"] == "completed"
        started = await bob.recv_until(lambda e: e.get("type") == "run.started"
                                       and e.get("run_id") == "b-6")
        assert started["user_id"] == "bob" and started["client_id"] == "b"
        assert (await bob.recv_until(finished("b-6")))["status"] == "completed"


async def test_a_start_from_the_tab_whose_run_is_active_takes_that_runs_place(
        server: Server) -> None:
    """Section 6: the same client's `run.start` supersedes its active run, queued runs
    or not; the new run takes the old one's place, not one ahead of the queue's."""
    async with joined(server) as (alice, _), joined(server, sub="bob", client_id="b") as (bob, _):
        await start(alice, WAITS, run_id="a-1")
        await alice.recv_until("tool.call")
        await enqueue(bob, script({"say": "bob"}), "b-1")
        again = await start(alice, script({"say": "again"}), run_id="a-2", tools=[])
        assert again["status"] == "running"
        ended = await alice.recv_until(finished("a-1"))
        assert (ended["status"], ended["reason"]) == ("cancelled", "superseded")
        for run_id in ("a-2", "b-1"):
            assert (await alice.recv_until(finished(run_id)))["status"] == "completed"
        assert [e["run_id"] for e in alice.events if e.get("type") == "run.started"] == [
            "a-1", "a-2", "b-1"]


@pytest.mark.redis
async def test_a_start_after_the_run_seen_ending_on_another_instance_is_not_busy() -> None:
    """Bob's run ends on one instance; Alice, on the other, saw its `run.finished` and
    starts hers: it was refused `document_busy` in about half the tries (its owner frees
    the document only after logging the end)."""
    async with redis_process() as redis, contextlib.AsyncExitStack() as stack:
        one = await stack.enter_async_context(running_server(redis_url=redis.url))
        two = await stack.enter_async_context(running_server(redis_url=redis.url))
        alice, _ = await stack.enter_async_context(joined(one))
        bob, _ = await stack.enter_async_context(joined(two, sub="bob", client_id="b"))
        for n in range(8):
            await start(bob, script({"say": "short"}), run_id=f"b-{n}", tools=[])
            await alice.recv_until(finished(f"b-{n}"))
            await start(alice, script({"say": "mine"}), run_id=f"a-{n}", tools=[])
            assert (await bob.recv_until(finished(f"a-{n}")))["status"] == "completed"


@pytest.mark.redis
async def test_an_interrupt_from_another_instance_starts_ahead_of_the_queue() -> None:
    """Carol interrupts Alice's run (owned by the other instance) while Bob's waits: the
    owner started Bob's queued run in the gap, and Carol, whose interrupt had already
    ended Alice's run, was refused `document_busy`."""
    async with redis_process() as redis, contextlib.AsyncExitStack() as stack:
        one = await stack.enter_async_context(running_server(redis_url=redis.url))
        two = await stack.enter_async_context(running_server(redis_url=redis.url))
        alice, _ = await stack.enter_async_context(joined(one))
        bob, _ = await stack.enter_async_context(joined(one, sub="bob", client_id="b"))
        carol, _ = await stack.enter_async_context(joined(two, sub="carol", client_id="c"))
        await start(alice, WAITS, run_id="a-1")
        await alice.recv_until("tool.call")
        await enqueue(bob, script({"say": "bob speaks slowly"}, delay_ms=100), "b-1")
        ack = await start(carol, script({"say": "carol"}), run_id="c-1", tools=[],
                          options={"if_busy": "interrupt"})
        assert ack["status"] == "running"
        ended = await carol.recv_until(finished("a-1"))
        assert (ended["status"], ended["reason"]) == ("cancelled", "interrupted")
        for run_id in ("c-1", "b-1"):
            assert (await carol.recv_until(finished(run_id)))["status"] == "completed"
        assert [e["run_id"] for e in carol.events if e.get("type") == "run.started"] == [
            "a-1", "c-1", "b-1"]


async def _edit(client: Client, version: int, at: int, insert: int, remove: int = 0) -> None:
    await client.send({"type": "editor.change", "document_version": version, "origin": "user",
                       "changes": [{"from": at, "to": at + remove, "insert": insert}]})
    await client.recv_until(lambda e: e.get("type") == "document.changed"
                            and e.get("document_version") == version)


async def test_edits_made_while_a_run_waits_move_its_scope_before_it_starts(
        server: Server) -> None:
    """Bob's run waits with scope [100, 120) at version 1; Alice types 50 characters at
    the start (version 2). When Bob's run starts, it is at version 2 with its scope at
    [150, 170): an edit at 110 moves it, one at 160 ends it. It used to start with
    version 1 and [100, 120), so the edit in its real text went through."""
    document = {"text": "x" * 300, "version": 1}
    async with joined(server) as (alice, _), joined(server, sub="bob", client_id="b") as (bob, _):
        await start(alice, WAITS, run_id="a-edit")
        await alice.recv_until("tool.call")
        await start(bob, WAITS, run_id="b-edit", options={"if_busy": "enqueue",
                                                          "on_edit": "overlap"},
                    context={"document": document, "scope": [{"from": 100, "to": 120}]})
        await _edit(alice, 2, 0, 50)  # Alice's own run (on_edit abort) ends with it
        assert (await alice.recv_until(finished("a-edit")))["reason"] == "document_changed"
        tool_call = await bob.recv_until(lambda e: e.get("type") == "tool.call"
                                         and e.get("run_id") == "b-edit")
        assert tool_call["document_version"] == 2  # was 1
        await _edit(alice, 3, 110, 1)  # before its scope now: it moves
        moved = await bob.recv_until("run.scope")
        assert moved["scope"] == [{"from": 151, "to": 171}]
        await _edit(alice, 4, 160, 1)  # inside it: the run ends
        ended = await bob.recv_until(finished("b-edit"))
        assert (ended["status"], ended["reason"]) == ("aborted", "document_changed")


async def test_a_persons_edit_while_a_default_run_waits_ends_it_unstarted(
        server: Server) -> None:
    async with joined(server) as (alice, _), joined(server, sub="bob", client_id="b") as (bob, _):
        await start(alice, WAITS, run_id="a-x")
        tool_call = await alice.recv_until("tool.call")
        await enqueue(bob, WAITS, "b-x")  # on_edit "abort", the default
        await alice.send({"type": "editor.change", "document_version": 2, "origin": "agent"})
        await _edit(bob, 3, 0, 1)  # Bob types while his own run waits
        ended = await bob.recv_until(finished("b-x"))
        assert (ended["status"], ended["reason"], ended["steps"]) == (
            "aborted", "document_changed", 0)
        assert not of_run(bob.events, "b-x", "run.started")
        assert (await alice.recv_until(finished("a-x")))["reason"] == "document_changed"
        del tool_call  # the same edit ended the active run (on_edit "abort")


async def test_a_run_that_waited_behind_more_than_the_log_keeps_still_starts() -> None:
    """Nobody edited; the run before it logged more events than the log keeps, so its
    wait cannot be read back: that is not a person's edit (it ended `aborted` /
    `document_changed`); it starts, and its model is told the document may have changed."""
    async with running_server(log_max_events=20) as srv, joined(srv) as (alice, _), \
            joined(srv, sub="bob", client_id="b") as (bob, _):
        long_answer = script({"tool_calls": [call("read_document")]},
                             {"say": "word " * 40}, chunk_chars=4, delay_ms=2)
        await start(alice, long_answer, run_id="a-long")
        tool_call = await alice.recv_until("tool.call")
        await enqueue(bob, script({"say": "bob"}), "b-after")
        await answer(alice, tool_call, {"text": "doc"})
        assert (await alice.recv_until(finished("a-long")))["status"] == "completed"
        assert (await bob.recv_until(finished("b-after"), timeout=10))["status"] == "completed"
