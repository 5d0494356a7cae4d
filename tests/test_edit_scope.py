"""Edit-aware runs (PROTOCOL.md section 11) over real sockets: which edits end a run,
how its scope moves, what the model is told, versions on tool calls, stale results."""

from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.fake_openai import FakeOpenAI, Reply, running_fake_openai
from tests.harness import Client, Server, joined, running_server
from tests.runs import answer, call, of_run, script, start

WAITS_ON_A_TOOL = script({"tool_calls": [call("read_document")]},
                         {"tool_calls": [call("read_document")]}, {"say": "done"})
DOCUMENT = {"text": "0123456789" * 4, "version": 1}


async def scoped_run(client: Client, on_edit: str, scope: list[dict[str, int]] | None
                     ) -> dict[str, Any]:
    context: dict[str, Any] = {"document": DOCUMENT}
    if scope is not None:
        context["scope"] = scope
    ack = await start(client, WAITS_ON_A_TOOL, context=context,
                      options={"on_edit": on_edit})
    ack["pending"] = await client.recv_until("tool.call")
    return ack


async def edit(client: Client, version: int, *changes: tuple[int, int, int] | None,
               origin: str = "user") -> dict[str, Any]:
    """Send an editor.change; return its document.changed (the edit has been judged)."""
    message: dict[str, Any] = {"type": "editor.change", "document_version": version,
                               "origin": origin, "summary": f"edit {version}"}
    if None not in changes:
        message["changes"] = [{"from": c[0], "to": c[1], "insert": c[2]}
                              for c in changes if c is not None]
    await client.send(message)
    return await client.recv_until(lambda e: e.get("type") == "document.changed"
                                   and e.get("document_version") == version)


async def finish_run(client: Client, ack: dict[str, Any]) -> dict[str, Any]:
    """Answer the pending call and every later one until the run ends."""
    run_id = ack["run_id"]
    await answer(client, ack["pending"], {"text": "doc"})
    while True:
        event = await client.recv_until(lambda e: e.get("run_id") == run_id and e.get("type")
                                        in ("tool.call", "run.finished"))
        if event["type"] == "run.finished":
            return event
        await answer(client, event, {"text": "doc"})


def ended(client: Client, run_id: str) -> bool:
    return bool(of_run(client.events, run_id, "run.finished"))


async def test_an_edit_before_the_scope_moves_it_and_does_not_abort(server: Server) -> None:
    async with joined(server) as (alice, welcome), \
            joined(server, sub="bob", client_id="b") as (bob, _):
        assert "edit_scope" in welcome["features"]
        ack = await scoped_run(alice, "overlap", [{"from": 20, "to": 30}])
        await edit(bob, 2, (2, 5, 10))  # replace 3 units by 10, before the scope: +7
        moved = await alice.recv_until("run.scope")
        assert moved["scope"] == [{"from": 27, "to": 37}] and moved["user_id"] == "bob"
        assert moved["document_version"] == 2
        await edit(bob, 3, (50, 50, 4))  # after the scope: it stays where it is
        stayed = await alice.recv_until("run.scope")
        assert stayed["scope"] == [{"from": 27, "to": 37}] and stayed["document_version"] == 3
        assert not ended(alice, ack["run_id"])
        assert (await finish_run(alice, ack))["status"] == "completed"


@pytest.mark.parametrize("at", [20, 30])
async def test_an_insertion_exactly_at_the_scope_edge_does_not_abort(server: Server,
                                                                     at: int) -> None:
    async with joined(server) as (alice, _):
        ack = await scoped_run(alice, "overlap", [{"from": 20, "to": 30}])
        await edit(alice, 2, (at, at, 5))
        assert not ended(alice, ack["run_id"])
        assert (await finish_run(alice, ack))["status"] == "completed"
        scopes = [e["scope"] for e in of_run(alice.events, ack["run_id"], "run.scope")]
        assert scopes == [[{"from": 25, "to": 35}] if at == 20 else [{"from": 20, "to": 30}]]


@pytest.mark.parametrize("changes", [[(25, 26, 0)], [(19, 21, 1)], [(25, 25, 3)],
                                     [(0, 1, 0), (19, 20, 2)], [None]])
async def test_an_edit_touching_the_scope_or_without_ranges_aborts(
        server: Server, changes: list[tuple[int, int, int] | None]) -> None:
    async with joined(server) as (alice, _):
        ack = await scoped_run(alice, "overlap", [{"from": 20, "to": 30}])
        await edit(alice, 2, *changes)
        finished = await alice.recv_until("run.finished")
        assert finished["run_id"] == ack["run_id"]
        assert (finished["status"], finished["reason"]) == ("aborted", "document_changed")


async def test_continue_never_aborts_and_default_abort_is_unchanged(server: Server) -> None:
    async with joined(server) as (alice, _):
        ack = await scoped_run(alice, "continue", None)
        await edit(alice, 2, None)
        await edit(alice, 3, (0, 40, 1))
        assert (await finish_run(alice, ack))["status"] == "completed"
        ack = await scoped_run(alice, "abort", [{"from": 20, "to": 30}])
        await edit(alice, 4, (50, 51, 0))  # far away, but abort is abort
        assert (await alice.recv_until("run.finished"))["reason"] == "document_changed"


async def test_agent_edits_never_abort_and_tool_calls_carry_the_latest_version(
        server: Server) -> None:
    async with joined(server) as (alice, _):
        ack = await scoped_run(alice, "abort", None)
        first = ack["pending"]
        assert first["document_version"] == 1  # context.document.version
        await edit(alice, 7, (0, 1, 1), origin="agent")
        await answer(alice, first, {"text": "doc"})
        second = await alice.recv_until(lambda e: e.get("type") == "tool.call"
                                        and e["call_id"] != first["call_id"])
        assert second["document_version"] == 7
        await answer(alice, second, {"text": "doc"})
        assert (await alice.recv_until("run.finished"))["status"] == "completed"


async def test_a_results_document_version_is_the_next_calls(server: Server) -> None:
    """A tool that edits reports the version it left (`tool.result.document_version`),
    with no `editor.change` of its own: the next call carries that version, so a client
    refusing calls made on an older document does not refuse every later call. An
    integer version never moves back: a person's later edit reported first stands."""
    async with joined(server) as (alice, _):
        ack = await start(alice, script(*[{"tool_calls": [call("read_document")]}] * 3,
                                        {"say": "done"}),
                          context={"document": DOCUMENT}, options={"on_edit": "continue"})
        first = await alice.recv_until("tool.call")
        await answer(alice, first, {"ok": True}, document_version=8)
        second = await alice.recv_until(lambda e: e.get("type") == "tool.call"
                                        and e["call_id"] != first["call_id"])
        assert second["document_version"] == 8
        await edit(alice, 9, (0, 1, 1))  # a person's edit, reported before the result
        await answer(alice, second, {"ok": True}, document_version=8)
        third = await alice.recv_until(lambda e: e.get("type") == "tool.call"
                                       and e["call_id"] not in (first["call_id"],
                                                                second["call_id"]))
        assert third["document_version"] == 9
        await answer(alice, third, {"ok": True})
        assert (await alice.recv_until("run.finished"))["status"] == "completed"
        assert ack["status"] == "running"


async def test_the_runs_own_edits_inside_its_scope_resize_it(server: Server) -> None:
    """The run wrote 30 units inside its scope [10, 20): the scope is [10, 50) and says so
    (`run.scope`); a person's edit at 35, in the run's new text, ends it. The scope
    used to stay [10, 20), so that edit went through and one at 15 would have
    "overlapped"; an edit list with one overlapping change was dropped whole."""
    async with joined(server) as (alice, _):
        ack = await scoped_run(alice, "overlap", [{"from": 10, "to": 20}])
        await edit(alice, 2, (0, 0, 5), (17, 17, 30), origin="agent")
        moved = await alice.recv_until("run.scope")
        assert (moved["scope"], moved["document_version"]) == ([{"from": 15, "to": 55}], 2)
        await edit(alice, 3, (60, 61, 0))  # after the scope: shifts nothing, ends nothing
        assert not ended(alice, ack["run_id"])
        await edit(alice, 4, (40, 41, 1))  # inside what the run wrote
        finished = await alice.recv_until("run.finished")
        assert (finished["status"], finished["reason"]) == ("aborted", "document_changed")


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with running_fake_openai() as fake_server:
        yield fake_server


async def test_the_model_is_told_of_edits_and_of_stale_results(fake: FakeOpenAI) -> None:
    fake.replies = [Reply(tool_calls=[{"name": "read_document", "arguments": {}}]),
                    Reply(tool_calls=[{"name": "read_document", "arguments": {}}]),
                    Reply(text=["ok"])]
    async with running_server(llm="openai", openai_api_key="sk-test", model="m",
                              openai_base_url=fake.base_url) as srv, \
            joined(srv) as (alice, _), joined(srv, sub="bob", client_id="b") as (bob, _):
        ack = await start(alice, "tidy the second paragraph",
                          context={"document": DOCUMENT, "scope": [{"from": 20, "to": 30}]},
                          options={"on_edit": "overlap"})
        first = await alice.recv_until("tool.call")
        await edit(bob, 2, (0, 2, 5))
        await answer(alice, first, {"text": "doc"})
        second = await alice.recv_until(lambda e: e.get("type") == "tool.call"
                                        and e["call_id"] != first["call_id"])
        await answer(alice, second, error={"code": "stale", "message": "moved on"})
        done = await alice.recv_until(lambda e: e.get("type") == "tool.done"
                                      and e["call_id"] == second["call_id"])
        assert done["status"] == "error" and done["error"]["code"] == "stale"
        assert (await alice.recv_until("run.finished"))["status"] == "completed"
    told = fake.requests[1]["messages"][-1]
    assert told["role"] == "user" and "bob" in told["content"]
    assert "document version 2" in told["content"] and "edit 2" in told["content"]
    assert "[0, 2) replaced by 5 units" in told["content"]
    stale = fake.requests[2]["messages"][-1]
    assert stale["role"] == "tool" and "read it again before editing" in stale["content"]
    assert ack["status"] == "running"


async def test_earlier_runs_say_how_they_ended_and_roles_alternate(fake: FakeOpenAI) -> None:
    fake.replies = [Reply(text=["half an ", "answer"], stall_after_text=True),
                    Reply(http_status=400), Reply(text=["fine"])]
    async with running_server(llm="openai", openai_api_key="sk-test", model="m",
                              openai_base_url=fake.base_url) as srv, \
            joined(srv) as (alice, _):
        await start(alice, "first question")
        await alice.recv_until("message.delta")
        await alice.send({"type": "editor.change"})  # aborts it mid-answer
        assert (await alice.recv_until("run.finished"))["reason"] == "document_changed"
        await start(alice, "second question")
        assert (await alice.recv_until("run.finished"))["status"] == "failed"
        await start(alice, "third question")
        assert (await alice.recv_until("run.finished"))["status"] == "completed"
    roles = [m["role"] for m in fake.requests[2]["messages"]]
    assert roles == ["system", "user", "assistant", "user", "assistant", "user"]
    interrupted = fake.requests[2]["messages"][2]["content"]
    assert interrupted.startswith("half an") and "interrupted (document_changed)" in interrupted
    assert "ended before the assistant replied" in fake.requests[2]["messages"][4]["content"]
