"""Issue 11, item 1, end to end: values nested 248-260 deep reach the backend
(`COWRITE_MAX_JSON_DEPTH=0` leaves only orjson's limit of 1024), where the
deepest cannot be encoded. Whatever the run engine answers, the log must stay
gapless, nobody is disconnected, and a resume from seq 0 replays exactly
the live stream. Memory backend and a real redis-server."""

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
import pytest

from tests.harness import Client, Server, joined, running_server
from tests.redis_support import redis_process
from tests.runs import call, script

ANY_ARGS = {"name": "edit", "description": "Takes anything.", "requires_approval": True,
            "parameters": {"type": "object"}}
READ_ANY = {"name": "read_document", "description": "Read.", "parameters": {"type": "object"}}
DEPTHS = range(248, 261)


def nested(depth: int) -> str:
    """JSON text of a value `depth` arrays deep (written by hand: orjson, like our
    server, will not encode 255 levels)."""
    return "[" * depth + '"leaf"' + "]" * depth


async def send_with(client: Client, message: dict[str, Any], deep_text: str) -> None:
    """Send `message` with its "__DEEP__" placeholder replaced by `deep_text`."""
    await client.ws.send(orjson.dumps(message).decode().replace('"__DEEP__"', deep_text))


@contextlib.asynccontextmanager
async def server_on(kind: str) -> AsyncIterator[Server]:
    if kind == "memory":
        async with running_server(max_json_depth=0, rate_messages_per_s=0,
                                  rate_runs_per_min=0) as srv:
            yield srv
        return
    async with redis_process() as redis, running_server(
            max_json_depth=0, rate_messages_per_s=0, rate_runs_per_min=0,
            redis_url=redis.url) as srv:
        yield srv


async def settle(client: Client, run_id: str) -> None:
    """End the run however the engine left it (it may have ended it already)."""
    await client.send({"type": "run.cancel", "id": "cancel", "run_id": run_id})
    await client.recv_until(lambda e: e.get("type") == "run.finished" and e["run_id"] == run_id,
                            timeout=10)


async def start_after(client: Client, prompt: str, tools: list[dict[str, Any]]
                      ) -> dict[str, Any]:
    """`run.start` right after the previous run ended: accepted at once (the engine
    waits for the previous run's release instead of answering `document_busy`)."""
    await client.send({"type": "run.start", "id": "start", "prompt": prompt, "tools": tools})
    reply = await client.recv_until(lambda e: e.get("reply_to") == "start")
    assert reply["type"] == "ack", reply
    return reply


async def resend(client: Client, tool_call: dict[str, Any], depth: int) -> None:
    """After a refused result, the same call still takes a plain one (nothing lost)."""
    await client.send({"type": "tool.result", "id": f"again-{depth}",
                       "run_id": tool_call["run_id"], "call_id": tool_call["call_id"],
                       "token": tool_call["token"], "output": {"plain": True}})


def match(**fields: Any) -> Callable[[dict[str, Any]], bool]:
    return lambda event: all(event.get(k) == v for k, v in fields.items())


def durable(client: Client) -> list[dict[str, Any]]:
    return [e for e in client.events if "seq" in e]


@pytest.mark.parametrize("kind", ["memory", pytest.param("redis", marks=pytest.mark.redis)])
async def test_values_too_deep_to_log_leave_no_gap_and_resume_replays_all(kind: str) -> None:
    async with server_on(kind) as srv, joined(srv) as (alice, welcome), \
            joined(srv, sub="bob", client_id="b") as (bob, _):
        for depth in DEPTHS:
            # 1. as a tool.result output (tool.done adds one level around it)
            ack = await start_after(alice, script({"tool_calls": [call("read_document")]},
                                                  {"say": "ok"}), [READ_ANY])
            tool_call = await alice.recv_until(match(type="tool.call", run_id=ack["run_id"]))
            await send_with(alice, {
                "type": "tool.result", "id": f"out-{depth}", "run_id": tool_call["run_id"],
                "call_id": tool_call["call_id"], "token": tool_call["token"],
                "output": "__DEEP__"}, nested(depth))
            reply = await alice.recv_until(match(reply_to=f"out-{depth}"))
            if depth <= 253:
                assert reply["type"] == "ack", reply
            else:
                assert reply["type"] == "error" and reply["code"] == "invalid_message", reply
                assert "Recursion" not in reply["message"]  # no encoder text for clients
                await resend(alice, tool_call, depth)
                retried = await alice.recv_until(match(reply_to=f"again-{depth}"))
                assert retried["type"] == "ack", retried
            await settle(alice, ack["run_id"])
            # 2. as the edited arguments of an approval (tool.call adds one level)
            ack = await start_after(alice, script({"tool_calls": [call("edit", x=1)]}),
                                    [ANY_ARGS])
            asked = await alice.recv_until(
                match(type="approval.requested", run_id=ack["run_id"]))
            await send_with(alice, {
                "type": "approval", "id": f"ap-{depth}", "run_id": ack["run_id"],
                "call_id": asked["call_id"], "decision": "approve",
                "arguments": {"x": "__DEEP__"}}, nested(depth))
            answered = await alice.recv_until(match(reply_to=f"ap-{depth}"))
            if depth > 252:  # tool.call adds two levels (arguments, x): refused, still open
                assert answered["type"] == "error" and answered["code"] == "invalid_message"
                assert not [e for e in alice.events if e.get("type") == "tool.call"
                            and e.get("run_id") == ack["run_id"]]
            else:
                assert answered["type"] == "ack", answered
            await settle(alice, ack["run_id"])
        await bob.send({"type": "editor.change", "document_version": "end"})
        last = (await alice.recv_until("document.changed"))["seq"]
        await bob.recv_until(lambda e: e.get("seq") == last, timeout=10)
        for client in (alice, bob):  # gapless, no duplicate, same on both
            seqs = [e["seq"] for e in durable(client)]
            assert seqs == list(range(welcome["last_seq"] + 1, last + 1))
        assert [e["seq"] for e in durable(alice)] == [e["seq"] for e in durable(bob)]
        live = durable(alice)
        everything = {"epoch": welcome["epoch"], "after_seq": 0}
        async with joined(srv, client_id="again", resume=everything) as (again, w):
            assert w["resumed"] is True and w["replayed"] == last
            await again.recv_until(lambda e: e.get("seq") == last, timeout=10)
            replayed = durable(again)
        assert [orjson.dumps(e) for e in replayed[-len(live):]] == \
            [orjson.dumps(e) for e in live]
        assert not alice.ws.close_code and not bob.ws.close_code
