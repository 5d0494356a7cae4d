"""Approvals, cancel, abort on edit, timeouts, grace and races
(PROTOCOL.md section 6), end to end over real sockets."""

import asyncio
from typing import Any

from tests.harness import Client, Server, joined, running_server
from tests.runs import answer, call, of_run, script, start

NEEDS_APPROVAL = script(
    {"say": "Replacing.", "tool_calls": [call("replace_document", text="new text")]},
    {"say": "After."})


def after_finished(client: Client, run_id: str) -> list[dict[str, Any]]:
    events = of_run(client.events, run_id)
    index = next(i for i, e in enumerate(events) if e["type"] == "run.finished")
    return events[index + 1:]


async def test_approve_dispatches_the_same_call(server: Server) -> None:
    async with joined(server) as (client, _):
        ack = await start(client, NEEDS_APPROVAL)
        requested = await client.recv_until("approval.requested")
        assert requested["name"] == "replace_document"
        assert requested["arguments"] == {"text": "new text"} and requested["expires_at"] > 0
        assert not of_run(client.events, ack["run_id"], "tool.call")  # nothing before approval
        await client.send({"type": "approval", "id": "a", "run_id": ack["run_id"],
                           "call_id": requested["call_id"], "decision": "approve"})
        resolved = await client.recv_until("approval.resolved")
        assert resolved["decision"] == "approve" and resolved["user_id"] == "alice"
        tool_call = await client.recv_until("tool.call")
        assert tool_call["call_id"] == requested["call_id"]
        assert tool_call["arguments"] == {"text": "new text"}
        await answer(client, tool_call, {"ok": True})
        assert (await client.recv_until("run.finished"))["status"] == "completed"


async def test_reject_tells_the_model_and_the_loop_goes_on(server: Server) -> None:
    async with joined(server) as (client, _):
        ack = await start(client, NEEDS_APPROVAL)
        requested = await client.recv_until("approval.requested")
        await client.send({"type": "approval", "run_id": ack["run_id"], "reason": "no thanks",
                           "call_id": requested["call_id"], "decision": "reject"})
        done = await client.recv_until("tool.done")
        assert done["status"] == "rejected" and done["call_id"] == requested["call_id"]
        assert "rejected by the user" in done["error"]["message"]
        finished = await client.recv_until("run.finished")
        assert finished["status"] == "completed" and finished["steps"] == 2
        assert not of_run(client.events, ack["run_id"], "tool.call")


async def test_approve_with_edited_arguments_and_for_the_run(server: Server) -> None:
    twice = script({"tool_calls": [call("replace_document", text="one")]},
                   {"tool_calls": [call("replace_document", text="two")]}, {})
    async with joined(server) as (client, _):
        ack = await start(client, twice)
        run_id = ack["run_id"]
        requested = await client.recv_until("approval.requested")
        base = {"type": "approval", "run_id": run_id, "call_id": requested["call_id"]}
        await client.send({**base, "id": "bad", "decision": "approve", "arguments": {"txt": 1}})
        error = await client.recv_until("error")
        assert error["code"] == "invalid_message" and error["reply_to"] == "bad"
        await client.send({**base, "id": "good", "decision": "approve", "scope": "run",
                           "arguments": {"text": "edited"}})
        first = await client.recv_until("tool.call")
        assert first["arguments"] == {"text": "edited"}
        await answer(client, first, {"ok": True})
        second = await client.recv_until("tool.call")  # approved for the run: no new request
        assert second["arguments"] == {"text": "two"}
        await answer(client, second, {"ok": True})
        assert (await client.recv_until("run.finished"))["status"] == "completed"
        assert len(of_run(client.events, run_id, "approval.requested")) == 1


async def test_only_the_runs_user_may_answer_or_cancel(server: Server) -> None:
    async with joined(server) as (client, _), joined(server, sub="bob", client_id="b") as (bob, _):
        ack = await start(client, NEEDS_APPROVAL)
        requested = await bob.recv_until("approval.requested")
        await bob.send({"type": "approval", "id": "x", "run_id": ack["run_id"],
                        "call_id": requested["call_id"], "decision": "approve"})
        assert (await bob.recv_until("error"))["code"] == "forbidden"
        await bob.send({"type": "run.cancel", "id": "y", "run_id": ack["run_id"]})
        assert (await bob.recv_until("error"))["code"] == "forbidden"
        await client.send({"type": "approval", "id": "z", "run_id": ack["run_id"],
                           "call_id": "other", "decision": "approve"})
        assert (await client.recv_until("error"))["code"] == "call_not_pending"
        await client.send({"type": "run.cancel", "id": "c", "run_id": ack["run_id"]})
        finished = await client.recv_until("run.finished")
        assert finished["status"] == "cancelled" and finished["reason"] == "user_cancelled"
        done = await client.recv_until("tool.done")
        assert done["status"] == "cancelled" and done["call_id"] == requested["call_id"]
        await client.send({"type": "run.cancel", "id": "again", "run_id": ack["run_id"]})
        assert (await client.recv_until("error"))["code"] == "run_not_active"


async def test_user_edit_aborts_at_once(server: Server) -> None:
    long_text = script({"say": "word " * 400}, chunk_chars=5, delay_ms=5)
    async with joined(server) as (client, _), joined(server, sub="bob", client_id="b") as (bob, _):
        ack = await start(client, long_text)
        run_id = ack["run_id"]
        for _ in range(3):
            await client.recv_until("message.delta")
        await bob.send({"type": "editor.change", "origin": "agent"})  # agent edits never abort
        await client.recv_until(lambda e: e.get("type") == "document.changed")
        await bob.send({"type": "editor.change", "document_version": 7})
        finished = await client.recv_until("run.finished")
        assert finished["status"] == "aborted" and finished["reason"] == "document_changed"
        changed = await client.recv_until(
            lambda e: e.get("type") == "document.changed" and e.get("document_version") == 7)
        assert changed["seq"] > finished["seq"] and changed["user_id"] == "bob"
        await asyncio.sleep(0.3)  # the model would have kept streaming for ~2 s
        await client.send({"type": "ping", "id": "sync"})
        await client.recv_until("pong")
        assert after_finished(client, run_id) == []
    history = await server.services.backend.read_history("doc-1")
    partial = [m for m in history if m["role"] == "assistant" and m["run_id"] == run_id]
    assert partial and partial[0]["interrupted"] is True
    assert 0 < len(partial[0]["content"]) < len("word " * 400)


async def test_abort_cancels_pending_calls_and_late_results_are_refused(server: Server) -> None:
    async with joined(server) as (client, _):
        ack = await start(client, script({"tool_calls": [call("read_document")]}))
        tool_call = await client.recv_until("tool.call")
        await client.send({"type": "editor.change"})
        finished = await client.recv_until("run.finished")
        done = await client.recv_until("tool.done")
        assert done["status"] == "cancelled" and done["seq"] < finished["seq"]
        await answer(client, tool_call, {"text": "late"}, id="late")
        error = await client.recv_until("error")
        assert error["code"] == "run_not_active" and error["reply_to"] == "late"
        assert len(of_run(client.events, ack["run_id"], "run.finished")) == 1


async def test_tool_timeout() -> None:
    async with running_server(tool_timeout_s=0.3) as srv, joined(srv) as (client, _):
        await start(client, script({"tool_calls": [call("read_document")]}))
        await client.recv_until("tool.call")
        done = await client.recv_until("tool.done")
        assert done["status"] == "timeout"
        finished = await client.recv_until("run.finished")
        assert finished["status"] == "timed_out" and finished["reason"] == "tool_timeout"


async def test_approval_timeout() -> None:
    async with running_server(approval_timeout_s=0.3) as srv, joined(srv) as (client, _):
        await start(client, NEEDS_APPROVAL)
        await client.recv_until("approval.requested")
        done = await client.recv_until("tool.done")
        assert done["status"] == "timeout"
        finished = await client.recv_until("run.finished")
        assert finished["status"] == "timed_out" and finished["reason"] == "approval_timeout"


async def test_run_timeout() -> None:
    async with running_server(run_timeout_s=0.4) as srv, joined(srv) as (client, _):
        await start(client, script({"say": "z" * 200}, chunk_chars=1, delay_ms=20))
        finished = await client.recv_until("run.finished", timeout=3)
        assert finished["status"] == "timed_out" and finished["reason"] == "run_timeout"


async def test_client_grace_aborts_when_the_executor_stays_away() -> None:
    async with running_server(client_grace_s=0.4) as srv, \
            joined(srv, sub="bob", client_id="watcher") as (watcher, _):
        async with joined(srv) as (client, _):
            await start(client, script({"tool_calls": [call("read_document")]}))
            await client.recv_until("tool.call")
        finished = await watcher.recv_until("run.finished", timeout=3)
        assert finished["status"] == "aborted" and finished["reason"] == "client_gone"


async def test_client_grace_spares_an_executor_that_comes_back() -> None:
    async with running_server(client_grace_s=0.6) as srv:
        async with joined(srv) as (client, _):
            await start(client, script({"tool_calls": [call("read_document")]}))
            tool_call = await client.recv_until("tool.call")
        await asyncio.sleep(0.3)
        async with joined(srv) as (again, _):
            await asyncio.sleep(0.6)  # past the grace period, connected
            await answer(again, tool_call, {"text": "back"})
            assert (await again.recv_until("run.finished"))["status"] == "completed"


async def test_racing_enders_produce_exactly_one_finish(server: Server) -> None:
    for round_ in range(8):
        async with joined(server, client_id=f"t{round_}") as (client, _):
            ack = await start(client, script(
                {"tool_calls": [call("read_document"), call("replace_document", text="x")]},
                {"say": "more " * 50}), run_id=f"race-{round_}")
            run_id = ack["run_id"]
            tool_call = await client.recv_until("tool.call")
            messages: list[dict[str, Any]] = [
                {"type": "editor.change"},
                {"type": "tool.result", "run_id": run_id, "call_id": tool_call["call_id"],
                 "token": tool_call["token"], "output": {"text": "t"}},
                {"type": "approval", "run_id": run_id, "call_id": "whatever",
                 "decision": "approve"},
                {"type": "run.cancel", "run_id": run_id},
            ]
            order = messages[round_ % 4:] + messages[:round_ % 4]
            await asyncio.gather(*(client.send(m) for m in order))
            await client.recv_until("run.finished")
            await client.send({"type": "ping", "id": "sync"})
            await client.recv_until("pong")
            await asyncio.sleep(0.05)
            finishes = of_run(client.events, run_id, "run.finished")
            assert len(finishes) == 1
            assert after_finished(client, run_id) == []
            dones = of_run(client.events, run_id, "tool.done")
            assert len({d["call_id"] for d in dones}) == len(dones)  # one tool.done per call
            assert not [e for e in client.events if e.get("code") == "internal"]
