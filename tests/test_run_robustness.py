"""No input can leave a document busy (PROTOCOL.md sections 6 and 10), over real sockets.

Each test throws something at a document and then checks what a second user
notices: that they can start a run on the same document and see it complete,
and that nobody was told an exception's text.
"""

import asyncio
import contextlib
import random
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from tests.harness import Client, Server, joined, running_server
from tests.redis_support import redis_process
from tests.runs import READ, REPLACE_DOC, answer, call, of_run, script, start

DEPTHS = [100, 300, 1000, 5000]
WITH_TOOL = script({"tool_calls": [call("read_document")]}, {"say": "done"})
NEEDS_APPROVAL = script({"tool_calls": [call("replace_document", text="x")]}, {"say": "done"})


DEEP = "__deep__"


def nested_json(depth: int) -> str:
    """`{"a":[{"a":[...]}]}`: `depth` levels of objects and arrays, as JSON text
    (written by hand: encoders refuse such depths)."""
    opens = "".join('{"a":' if level % 2 == 0 else "[" for level in range(depth))
    closes = "".join("}" if level % 2 == 0 else "]" for level in reversed(range(depth)))
    return opens + '"leaf"' + closes


async def send_deep(client: Client, message: dict[str, Any], depth: int) -> None:
    """Send `message` with every `DEEP` placeholder replaced by a `depth`-deep value."""
    text = orjson.dumps(message).decode().replace(f'"{DEEP}"', nested_json(depth))
    await client.ws.send(text)


def finished_event(run_id: str) -> Callable[[dict[str, Any]], bool]:
    return lambda e: e.get("type") == "run.finished" and e.get("run_id") == run_id


def answer_to(tag: str) -> Any:
    """The reply to frame `tag`, or the error about a frame too deep to even read its id."""
    return lambda e: e.get("reply_to") == tag or (
        e.get("type") == "error" and e.get("reply_to") is None
        and e.get("code") == "invalid_message")


def nested(depth: int) -> Any:
    """A shallow-enough nested value for the fuzzer (the encoder takes < 255 levels)."""
    return orjson.loads(nested_json(min(depth, 200)))


async def sync(client: Client) -> None:
    """Every frame the server sent before this point has arrived."""
    tag = random.randrange(1, 2**52)
    await client.send({"type": "ping", "ts": tag})
    await client.recv_until(lambda e: e.get("type") == "pong" and e.get("ts") == tag)


async def another_user_completes_a_run(server: Server, document_id: str = "doc-1") -> None:
    async with joined(server, document_id, sub="bob", client_id="bob-tab") as (bob, _):
        ack = await start(bob, script({"say": "bob was here"}))
        finished = await bob.recv_until(
            lambda e: e.get("type") == "run.finished" and e.get("run_id") == ack["run_id"])
        assert finished["status"] == "completed", finished


def no_internal_errors(client: Client) -> None:
    leaked = [e for e in client.events if e.get("type") == "error"
              and (e.get("code") == "internal" or "Traceback" in str(e.get("message")))]
    assert not leaked, leaked


async def end_own_run(client: Client, run_id: str | None) -> None:
    """Cancel the run if it is still going (the document must then be free)."""
    if run_id is None or of_run(client.events, run_id, "run.finished"):
        return
    await client.send({"type": "run.cancel", "id": "cleanup", "run_id": run_id})
    await client.recv_until(
        lambda e: e.get("type") == "run.finished" and e.get("run_id") == run_id)


@pytest.mark.parametrize("depth", DEPTHS)
@pytest.mark.parametrize("where", ["extra", "selection", "parameters", "options"])
async def test_deep_run_start_fields_are_refused_at_the_edge(server: Server, where: str,
                                                             depth: int) -> None:
    deep = DEEP
    fields: dict[str, Any] = {}
    tools: list[dict[str, Any]] | None = None
    if where in ("extra", "selection"):
        fields["context"] = {where: deep}
    elif where == "parameters":
        tools = [{"name": "deep", "parameters": {"type": "object", "properties": deep}}]
    else:
        fields["options"] = {"deep": deep}
    async with joined(server) as (alice, _):
        await send_deep(alice, {"type": "run.start", "id": "deep",
                                "prompt": script({"say": "hi"}), "tools": tools or [],
                                **fields}, depth)
        refused = await alice.recv_until(answer_to("deep"))
        assert refused["type"] == "error" and refused["code"] == "invalid_message", refused
        assert "deeper than 64 levels" in refused["message"]  # PROTOCOL.md section 10
        assert not [e for e in alice.events if e.get("type") == "run.started"]
        no_internal_errors(alice)
    await another_user_completes_a_run(server)


@pytest.mark.parametrize("depth", DEPTHS)
async def test_deep_tool_result_output_is_refused_and_the_call_stays_open(
        server: Server, depth: int) -> None:
    async with joined(server) as (alice, _):
        ack = await start(alice, WITH_TOOL)
        tool_call = await alice.recv_until("tool.call")
        await send_deep(alice, {"type": "tool.result", "id": "deep", "run_id": ack["run_id"],
                                "call_id": tool_call["call_id"], "token": tool_call["token"],
                                "output": DEEP}, depth)
        reply = await alice.recv_until(answer_to("deep"))
        assert reply["type"] == "error" and reply["code"] == "invalid_message", reply
        await answer(alice, tool_call, {"text": "fine"}, id="fine")  # nothing lost: it waits
        assert (await alice.recv_until(lambda e: e.get("reply_to") == "fine"))["type"] == "ack"
        finished = await alice.recv_until("run.finished")
        assert finished["status"] == "completed"
        dones = of_run(alice.events, ack["run_id"], "tool.done")
        assert len(dones) == 1 and dones[0]["status"] == "ok"
        no_internal_errors(alice)
    await another_user_completes_a_run(server)


@pytest.mark.parametrize("depth", DEPTHS)
async def test_deep_approved_arguments_are_refused_and_the_approval_stays_open(
        server: Server, depth: int) -> None:
    async with joined(server) as (alice, _):
        ack = await start(alice, NEEDS_APPROVAL)
        requested = await alice.recv_until("approval.requested")
        base = {"type": "approval", "run_id": ack["run_id"], "call_id": requested["call_id"],
                "decision": "approve"}
        await send_deep(alice, {**base, "id": "deep", "arguments": {"text": "x", "deep": DEEP}},
                        depth)
        reply = await alice.recv_until(answer_to("deep"))
        assert reply["type"] == "error" and reply["code"] == "invalid_message", reply
        await alice.send({**base, "id": "plain"})
        tool_call = await alice.recv_until("tool.call")
        await answer(alice, tool_call, {"ok": True})
        assert (await alice.recv_until("run.finished"))["status"] == "completed"
        no_internal_errors(alice)
    await another_user_completes_a_run(server)


def fuzz_message(rng: random.Random, run_id: str, call_id: str, token: str) -> Any:
    """A frame a confused or hostile client might send: valid, half-valid or junk."""
    junk: list[Any] = [None, 0, -1, "__big__", 1.5, "", "x" * 200, [], {},
                       nested(rng.randint(1, 80)), True, "\u0000\n\u202e"]
    kind = rng.choice(["run.start", "tool.result", "approval", "run.cancel", "editor.change",
                       "ping", "auth.refresh", "hello", "nope", None])
    message: dict[str, Any] = {"type": kind} if kind is not None else {}
    choices = {
        "run_id": [run_id, "nope", *junk], "call_id": [call_id, "other", *junk],
        "token": [token, "bad", *junk], "output": junk, "decision": ["approve", "reject", *junk],
        "prompt": [WITH_TOOL, NEEDS_APPROVAL, script({"say": "x"}), *junk],
        "tools": [[], [{"name": "read_document"}], *junk], "context": junk, "options": junk,
        "id": ["f", *junk], "origin": ["user", "agent", *junk], "arguments": junk,
        "scope": ["run", *junk], "mode": ["chat", "agent", *junk], "error": junk,
    }
    valid = {  # the fields that make each type valid, used most of the time
        "run.start": {"prompt": rng.choice([WITH_TOOL, NEEDS_APPROVAL, script({"say": "x"})]),
                      "tools": [READ, REPLACE_DOC]},
        "tool.result": {"run_id": run_id, "call_id": call_id, "token": token,
                        "output": rng.choice(junk[:9])},
        "approval": {"run_id": run_id, "call_id": call_id,
                     "decision": rng.choice(["approve", "reject"])},
        "run.cancel": {"run_id": run_id},
    }
    if kind in valid and rng.random() < 0.6:
        message.update(valid[kind])
    for key in rng.sample(sorted(choices), rng.randint(0, 5 if rng.random() < 0.4 else 1)):
        message[key] = rng.choice(choices[key])
    return message if rng.random() > 0.05 else rng.choice(junk)


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
async def test_seeded_fuzz_then_another_user_completes_a_run(seed: int) -> None:
    rng = random.Random(seed)
    async with running_server(max_invalid_messages=0, rate_messages_per_s=0,
                              rate_runs_per_min=0) as srv:
        async with joined(srv) as (alice, _):
            run_id = call_id = token = "none"
            for index in range(150):
                message = fuzz_message(rng, run_id, call_id, token)
                await alice.ws.send(orjson.dumps(message).decode().replace(
                    '"__big__"', str(2**70)))  # beyond 64 bits: encoders refuse it
                if index % 10 == 0:
                    await sync(alice)
                for event in alice.events:
                    if event.get("type") == "run.started":
                        run_id = event["run_id"]
                    elif event.get("type") == "tool.call" and event.get("token"):
                        call_id, token = event["call_id"], event["token"]
                    elif event.get("type") == "approval.requested":
                        call_id = event["call_id"]
            await sync(alice)
            no_internal_errors(alice)
            started = {e["run_id"] for e in alice.events if e.get("type") == "run.started"}
            assert started, "the fuzzer should start runs"
            for started_id in started:
                await end_own_run(alice, started_id)
            for started_id in started:
                assert len(of_run(alice.events, started_id, "run.finished")) == 1
            seqs = [e["seq"] for e in alice.events if "seq" in e]
            assert seqs == list(range(seqs[0], seqs[0] + len(seqs))) if seqs else True
        await another_user_completes_a_run(srv)


@pytest.mark.parametrize("order", range(6))
async def test_approval_cancel_edit_and_result_arriving_together(server: Server,
                                                                 order: int) -> None:
    async with joined(server, client_id=f"tab-{order}") as (alice, _):
        ack = await start(alice, script({"tool_calls": [call("replace_document", text="x"),
                                                          call("read_document")]}, {}))
        run_id = ack["run_id"]
        requested = await alice.recv_until("approval.requested")
        together: list[dict[str, Any]] = [
            {"type": "approval", "run_id": run_id, "call_id": requested["call_id"],
             "decision": "approve"},
            {"type": "approval", "run_id": run_id, "call_id": requested["call_id"],
             "decision": "reject"},
            {"type": "run.cancel", "run_id": run_id},
            {"type": "editor.change"},
        ]
        rng = random.Random(order)
        rng.shuffle(together)
        await asyncio.gather(*(alice.send(m) for m in together[:2 + order % 3]))
        tool_call = None
        for _ in range(3):
            await sync(alice)
            tool_call = next((e for e in of_run(alice.events, run_id, "tool.call")), None)
            if tool_call is not None or of_run(alice.events, run_id, "run.finished"):
                break
        if tool_call is not None and not of_run(alice.events, run_id, "run.finished"):
            await asyncio.gather(answer(alice, tool_call, {"ok": 1}),
                                 answer(alice, tool_call, {"ok": 2}),
                                 alice.send({"type": "run.cancel", "run_id": run_id}))
        await end_own_run(alice, run_id)
        await sync(alice)
        assert len(of_run(alice.events, run_id, "run.finished")) == 1
        dones = of_run(alice.events, run_id, "tool.done")
        assert len({d["call_id"] for d in dones}) == len(dones)
        calls = of_run(alice.events, run_id, "tool.call")
        assert len({c["call_id"] for c in calls}) == len(calls)
        no_internal_errors(alice)
    await another_user_completes_a_run(server)


@pytest.mark.parametrize("backend", ["memory", pytest.param("redis", marks=pytest.mark.redis)])
async def test_a_run_started_the_moment_the_last_one_finished_is_accepted(backend: str) -> None:
    """run.finished is logged a moment before the document is released; a start that
    arrives in that moment waits for the release instead of hearing document_busy."""
    async with contextlib.AsyncExitStack() as stack:
        overrides: dict[str, Any] = {}
        if backend == "redis":
            overrides["redis_url"] = (await stack.enter_async_context(redis_process())).url
        server = await stack.enter_async_context(running_server(**overrides))
        alice, _ = await stack.enter_async_context(joined(server))
        bob, _ = await stack.enter_async_context(joined(server, sub="bob", client_id="bob-tab"))
        for round_ in range(10):
            ack = await start(alice, script({"say": "quick"}), run_id=f"first-{round_}")
            await bob.recv_until(finished_event(ack["run_id"]))
            second = await start(bob, script({"say": "right after"}), run_id=f"second-{round_}")
            assert second["status"] == "running"
            await alice.recv_until(finished_event(second["run_id"]))
