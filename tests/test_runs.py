"""Agent runs end to end over real sockets with the scripted model
(PROTOCOL.md sections 6 and 9)."""

import asyncio

import httpx

from tests.harness import Server, joined, running_server, token
from tests.runs import EDITOR_TOOLS, answer, call, of_run, script, start


async def test_text_only_run_streams_deltas_and_completes(server: Server) -> None:
    async with joined(server) as (client, _), joined(server, sub="bob", client_id="b") as (peer, _):
        ack = await start(client, script({"say": "Hello, co-writer!"}, chunk_chars=5, delay_ms=2))
        run_id = ack["run_id"]
        assert ack["status"] == "running"
        finished = await client.recv_until("run.finished")
        events = of_run(client.events, run_id)
        assert [e["type"] for e in events] == [
            "run.started", "message.delta", "message.delta", "message.delta", "message.delta",
            "message.done", "run.finished"]
        assert "".join(e["delta"] for e in of_run(events, run_id, "message.delta")) == \
            "Hello, co-writer!"
        assert of_run(events, run_id, "message.done")[0]["text"] == "Hello, co-writer!"
        assert finished["status"] == "completed" and finished["steps"] == 1
        started = events[0]
        assert started["user_id"] == "alice" and started["client_id"] == "tab-1"
        # a collaborator sees the same events with the same seqs
        await peer.recv_until("run.finished")
        assert [e["seq"] for e in of_run(peer.events, run_id)] == [e["seq"] for e in events]


async def test_step_without_say_sends_no_message(server: Server) -> None:
    async with joined(server) as (client, _):
        ack = await start(client, script({"tool_calls": [call("read_document")]}, {}))
        tool_call = await client.recv_until("tool.call")
        await answer(client, tool_call, {"text": "doc"})
        finished = await client.recv_until("run.finished")
        run_events = of_run(client.events, ack["run_id"])
        assert not [e for e in run_events if e["type"].startswith("message.")]
        assert finished["status"] == "completed" and finished["steps"] == 2


async def test_client_tool_round_trip_and_history(server: Server) -> None:
    async with joined(server) as (client, _):
        ack = await start(client, script(
            {"say": "Reading.", "tool_calls": [call("read_document")]},
            {"say": "Inserting.", "tool_calls": [call("insert_text", text="!", position="end")]},
            {"say": "Done."}))
        run_id = ack["run_id"]
        first = await client.recv_until("tool.call")
        assert first["executor"] == "client" and first["client_id"] == "tab-1"
        assert first["name"] == "read_document" and first["arguments"] == {}
        assert first["token"] and first["expires_at"] > 0
        await answer(client, first, {"text": "Hello"})
        done = await client.recv_until("tool.done")
        assert done["status"] == "ok" and done["output"] == {"text": "Hello"}
        second = await client.recv_until("tool.call")
        assert second["arguments"] == {"text": "!", "position": "end"}
        await answer(client, second, error={"message": "editor is read-only", "code": "ro"})
        done = await client.recv_until("tool.done")
        assert done["status"] == "error" and done["error"]["message"] == "editor is read-only"
        finished = await client.recv_until("run.finished")
        assert finished["status"] == "completed" and finished["steps"] == 3
    async with httpx.AsyncClient(base_url=server.http) as http:
        history = (await http.get("/v1/documents/doc-1/history",
                                  headers={"Authorization": f"Bearer {token()}"})).json()
    messages = [m for m in history["messages"] if m["run_id"] == run_id]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant", "tool",
                                             "assistant"]
    assert messages[2]["name"] == "read_document" and "Hello" in messages[2]["content"]
    assert messages[2]["tool_call_id"] == first["call_id"]
    assert "read-only" in messages[4]["content"]


async def test_history_limit_gives_the_newest_messages(server: Server) -> None:
    """`?limit=N`: the newest N messages of the thread and whether older ones are left;
    a bad limit is a 400 (the parameter was ignored: every request got all of them)."""
    async with joined(server) as (client, _):
        for word in ("one", "two", "three"):
            await start(client, script({"say": word}))
            await client.recv_until("run.finished")
    auth = {"Authorization": f"Bearer {token()}"}
    async with httpx.AsyncClient(base_url=server.http) as http:
        url = "/v1/documents/doc-1/history"
        whole = (await http.get(url, headers=auth)).json()
        newest = (await http.get(url, params={"limit": 2}, headers=auth)).json()
        refused = [(await http.get(url, params={"limit": bad}, headers=auth)).status_code
                   for bad in ("0", "-1", "2.5", "many", "2001", "\u00b2")]
    assert len(whole["messages"]) == 6 and whole["more"] is False
    assert newest["messages"] == whole["messages"][-2:] and newest["more"] is True
    assert [m["content"] for m in newest["messages"]][-1].endswith("three")
    assert refused == [400] * 6


async def test_last_element_with_tools_takes_one_more_call(server: Server) -> None:
    async with joined(server) as (client, _):
        await start(client, script({"tool_calls": [call("read_document")]}))
        await answer(client, await client.recv_until("tool.call"), {"text": ""})
        finished = await client.recv_until("run.finished")
        assert finished["status"] == "completed" and finished["steps"] == 2


async def test_invalid_and_unknown_calls_go_back_to_the_model_not_the_client(
    server: Server,
) -> None:
    async with joined(server) as (client, _):
        ack = await start(client, script(
            {"tool_calls": [call("insert_text", position="middle"), call("launch_rockets"),
                            {"name": "read_document", "arguments": "{not json"}]},
            {"say": "ok"}))
        finished = await client.recv_until("run.finished")
        assert finished["status"] == "completed" and finished["steps"] == 2
        assert not of_run(client.events, ack["run_id"], "tool.call")
    async with httpx.AsyncClient(base_url=server.http) as http:
        history = (await http.get("/v1/documents/doc-1/history",
                                  headers={"Authorization": f"Bearer {token()}"})).json()
    tool_messages = [m["content"] for m in history["messages"] if m["role"] == "tool"]
    assert len(tool_messages) == 3
    assert "text" in tool_messages[0] and "required" in tool_messages[0]
    assert "unknown tool" in tool_messages[1] and "read_document" in tool_messages[1]
    assert "not valid JSON" in tool_messages[2]


async def test_result_rules_duplicate_wrong_token_not_pending(server: Server) -> None:
    async with joined(server) as (client, _), \
            joined(server, sub="bob", client_id="b") as (bob, _):
        ack = await start(client, script({"tool_calls": [call("read_document")]},
                                         {"tool_calls": [call("read_document")]}))
        run_id = ack["run_id"]
        tool_call = await client.recv_until("tool.call")
        # bob saw the token in the broadcast, but it is bound to alice
        await answer(bob, tool_call, {"text": "stolen"}, id="b1")
        assert (await bob.recv_until("error"))["code"] == "invalid_token"
        await answer(client, {**tool_call, "token": tool_call["token"][:-4] + "AAAA"}, 1, id="w")
        assert (await client.recv_until("error"))["code"] == "invalid_token"
        await client.send({"type": "tool.result", "id": "np", "run_id": run_id,
                           "call_id": "nope", "token": tool_call["token"], "output": 1})
        assert (await client.recv_until("error"))["code"] == "call_not_pending"
        await client.send({"type": "tool.result", "id": "nf", "run_id": "ghost",
                           "call_id": "c", "token": "t", "output": 1})
        assert (await client.recv_until("error"))["code"] == "run_not_found"
        await answer(client, tool_call, {"text": "first"}, id="r1")
        accepted = await client.recv_until(lambda e: e.get("reply_to") == "r1")
        assert accepted["type"] == "ack" and not accepted.get("duplicate")
        await answer(client, tool_call, {"text": "second"}, id="r2")
        duplicate = await client.recv_until(lambda e: e.get("reply_to") == "r2")
        assert duplicate["type"] == "ack" and duplicate["duplicate"] is True
        second_call = await client.recv_until("tool.call")
        await answer(client, second_call, {"text": "x"})
        await client.recv_until("run.finished")
        dones = of_run(client.events, run_id, "tool.done")
        assert [d["output"] for d in dones] == [{"text": "first"}, {"text": "x"}]
        await answer(client, second_call, {"text": "late"}, id="late")
        assert (await client.recv_until("error"))["code"] == "run_not_active"


async def test_result_accepted_from_another_connection_of_the_user(server: Server) -> None:
    async with joined(server) as (client, welcome):
        ack = await start(client, script({"tool_calls": [call("read_document")]}))
        tool_call = await client.recv_until("tool.call")
    # the tab dropped; the run goes on; it comes back and answers
    resume = {"epoch": welcome["epoch"], "after_seq": welcome["last_seq"]}
    async with joined(server, resume=resume) as (again, back):
        assert back["active_run"]["run_id"] == ack["run_id"]
        pending = back["active_run"]["pending"]
        assert pending[0]["call_id"] == tool_call["call_id"] and pending[0]["token"]
        assert back["active_run"]["status"] == "waiting_tool"
        await answer(again, tool_call, {"text": "after reconnect"})
        finished = await again.recv_until("run.finished")
        assert finished["status"] == "completed"
        replayed = [e["type"] for e in again.events[1:1 + back["replayed"]]]
        assert replayed == ["run.started", "tool.call"]


async def test_snapshot_hides_tokens_from_other_users(server: Server) -> None:
    async with joined(server) as (client, _):
        await start(client, script({"tool_calls": [call("read_document")]}))
        await client.recv_until("tool.call")
        async with joined(server, sub="bob", client_id="b") as (_, welcome):
            assert welcome["active_run"]["pending"][0].get("token") is None
            assert welcome["active_run"]["user_id"] == "alice"


async def test_chat_mode_is_one_call_without_tools(server: Server) -> None:
    async with joined(server) as (client, _):
        ack = await start(client, script({"say": "chatting", "tool_calls": [call("read_document")]},
                                         {"say": "never"}), mode="chat")
        finished = await client.recv_until("run.finished")
        assert finished["status"] == "completed" and finished["steps"] == 1
        assert not of_run(client.events, ack["run_id"], "tool.call")
        assert of_run(client.events, ack["run_id"], "run.started")[0]["mode"] == "chat"


async def test_server_tool_runs_on_the_server(server: Server) -> None:
    async with joined(server) as (client, _):
        await start(client, script(
            {"tool_calls": [call("text_stats", text="One two three. Four five!")]}, {}))
        tool_call = await client.recv_until("tool.call")
        assert tool_call["executor"] == "server" and "token" not in tool_call
        done = await client.recv_until("tool.done")
        assert done["status"] == "ok"
        assert done["output"]["words"] == 5 and done["output"]["sentences"] == 2
        assert (await client.recv_until("run.finished"))["status"] == "completed"


async def test_upstream_failure_fails_the_run(server: Server) -> None:
    async with joined(server) as (client, _):
        await start(client, script({"say": "Thinking", "fail": "model exploded"}))
        finished = await client.recv_until("run.finished")
        assert finished["status"] == "failed" and finished["reason"] == "upstream_error"
        assert finished["error"] == {"code": "upstream_error", "message": "model exploded",
                                     "details": {"kind": "server_error"}}


async def test_max_steps(server: Server) -> None:
    loop_forever = script(*[{"tool_calls": [call("text_stats", text="x")]}] * 5)
    async with joined(server) as (client, _):
        ack = await start(client, loop_forever, options={"max_steps": 3})
        finished = await client.recv_until("run.finished")
        assert finished["status"] == "failed" and finished["reason"] == "max_steps"
        assert finished["steps"] == 3
        assert len(of_run(client.events, ack["run_id"], "tool.call")) == 2  # third not executed
        # a run that needs exactly N calls completes
        await start(client, script({"tool_calls": [call("text_stats", text="x")]}, {"say": "ok"}),
                    options={"max_steps": 2}, run_id="exact")
        finished = await client.recv_until("run.finished")
        assert finished["status"] == "completed" and finished["steps"] == 2


async def test_allowed_models_and_the_servers_own_model() -> None:
    """`COWRITE_ALLOWED_MODELS=qwen` refused `options.model` naming the server's own
    `COWRITE_MODEL`, which a run without `options.model` uses anyway."""
    async with running_server(model="house-model", allowed_models=["qwen"]) as srv, \
            joined(srv) as (client, _):
        for model in ("qwen", "house-model"):
            await start(client, script({"say": "ok"}), options={"model": model},
                        run_id=f"m-{model}")
            finished = await client.recv_until("run.finished")
            assert finished["status"] == "completed"
        await client.send({"type": "run.start", "id": "other", "prompt": script({"say": "x"}),
                           "options": {"model": "gpt-9"}})
        refused = await client.recv_until(lambda e: e.get("reply_to") == "other")
        assert refused["type"] == "error" and refused["code"] == "invalid_message"


async def test_one_active_run_supersede_busy_and_idempotent_start(server: Server) -> None:
    slow = script({"say": "x" * 400}, chunk_chars=1, delay_ms=20)
    async with joined(server) as (client, _), joined(server, sub="bob", client_id="b") as (bob, _):
        first = await start(client, slow, run_id="r-1")
        await client.recv_until("message.delta")
        await bob.send({"type": "run.start", "id": "bs", "prompt": "mine now"})
        busy = await bob.recv_until("error")
        assert busy["code"] == "document_busy" and busy["reply_to"] == "bs"
        again = await start(client, slow, run_id="r-1")  # retry after a reconnect, say
        assert again["duplicate"] is True and again["status"] == "running"
        assert len(of_run(client.events, "r-1", "run.started")) == 1
        second = await start(client, script({"say": "newer"}), run_id="r-2")
        assert second["run_id"] == "r-2" and first["run_id"] == "r-1"
        superseded = await client.recv_until(
            lambda e: e.get("type") == "run.finished" and e["run_id"] == "r-1")
        assert superseded["status"] == "cancelled" and superseded["reason"] == "superseded"
        done = await client.recv_until(
            lambda e: e.get("type") == "run.finished" and e["run_id"] == "r-2")
        assert done["status"] == "completed"
        after = await start(client, slow, run_id="r-1")
        assert after["duplicate"] is True and after["status"] == "cancelled"


async def test_run_rate_limit_per_user() -> None:
    async with running_server(rate_runs_per_min=2) as srv, joined(srv) as (client, _):
        for n in range(2):
            await start(client, script({"say": "hi"}), run_id=f"rl-{n}")
            await client.recv_until("run.finished")
        await client.send({"type": "run.start", "id": "third", "prompt": "again"})
        error = await client.recv_until("error")
        assert error["code"] == "rate_limited" and error["retry_after_ms"] > 0
        assert error["reply_to"] == "third"


async def test_bad_tool_declarations_are_invalid_message(server: Server) -> None:
    async with joined(server) as (client, _):
        bad = {"name": "t", "parameters": {"type": "object", "properties": {"a": {"type": 7}}}}
        await client.send({"type": "run.start", "id": "s", "prompt": "p", "tools": [bad]})
        error = await client.recv_until("error")
        assert error["code"] == "invalid_message" and "t.parameters" in error["message"]
        # verdicts are kept per schema: a repeat, under another name, is refused alike
        await client.send({"type": "run.start", "id": "s2", "prompt": "p",
                           "tools": [{**bad, "name": "u"}]})
        again = await client.recv_until("error")
        assert again["reply_to"] == "s2" and again["code"] == "invalid_message"
        assert again["message"] == error["message"].replace("tools.t.", "tools.u.")


async def test_demo_prompt_reads_then_edits(server: Server) -> None:
    async with joined(server) as (client, _):
        await start(client, "tidy up please", tools=EDITOR_TOOLS)
        read = await client.recv_until("tool.call")
        assert read["name"] == "read_document"
        await answer(client, read, {"text": "Some words here."})
        insert = await client.recv_until("tool.call")
        assert insert["name"] == "insert_text" and "tidy up please" in insert["arguments"]["text"]
        await answer(client, insert, {"ok": True})
        finished = await client.recv_until("run.finished")
        assert finished["status"] == "completed"
        text = "".join(e["delta"] for e in client.events if e["type"] == "message.delta")
        assert "read 3 words" in text


async def test_dropped_connection_does_not_end_the_run(server: Server) -> None:
    async with joined(server) as (client, welcome):
        ack = await start(client, script({"say": "a" * 60}, chunk_chars=2, delay_ms=10))
        await client.recv_until("message.delta")
    await asyncio.sleep(0.8)  # the run finishes while nobody is connected
    resume = {"epoch": welcome["epoch"], "after_seq": welcome["last_seq"]}
    async with joined(server, resume=resume) as (again, back):
        assert back["resumed"] and back.get("active_run") is None
        events = [await again.recv() for _ in range(back["replayed"])]
    run_events = of_run(events, ack["run_id"])
    assert run_events[-1]["type"] == "run.finished" and run_events[-1]["status"] == "completed"
    assert "".join(e["delta"] for e in run_events if e["type"] == "message.delta") == "a" * 60
