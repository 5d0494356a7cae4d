"""Bad input, limits, seq numbering and resume (PROTOCOL.md sections 1, 3, 6a, 7)."""

import asyncio
import base64
import json
import os
import random
from typing import Any

from tests.harness import Client, RawClient, Server, joined, running_server, token, ws_client
from tests.runs import answer, call, script, start


async def change(client: Client, n: int) -> None:
    for i in range(n):
        await client.send({"type": "editor.change", "document_version": i})


async def seqs_until(client: Client, last: int) -> list[int]:
    seqs: list[int] = []
    while not seqs or seqs[-1] < last:
        event = await client.recv()
        if "seq" in event:
            seqs.append(event["seq"])
    return seqs


async def test_bad_frames_get_errors_and_the_connection_stays_usable(server: Server) -> None:
    async with joined(server) as (client, _):
        cases: list[tuple[Any, str]] = [
            ("not json", "invalid_message"),
            ("[1, 2]", "invalid_message"),
            (b"\x00binary", "invalid_message"),
            ({"id": "a1", "no": "type"}, "invalid_message"),
            ({"id": "a2", "type": "dance"}, "unknown_type"),
            ({"id": "a3", "type": "run.start"}, "invalid_message"),
            ({"id": "a4", "type": "ping", "extra": 1}, "invalid_message"),
            ({"id": "a5", "type": "tool.result", "run_id": "r", "call_id": "c", "token": "t"},
             "invalid_message"),
            ({"id": "a6", "type": "hello", "protocol": 1, "client_id": "x"}, "invalid_message"),
        ]
        for frame, code in cases:
            if isinstance(frame, dict):
                await client.send(frame)
            else:
                await client.ws.send(frame)
            error = await client.recv_until("error")
            assert error["code"] == code, (frame, error)
            if isinstance(frame, dict) and "id" in frame:
                assert error["reply_to"] == frame["id"]
        assert error["message"]
        await client.send({"type": "ping", "ts": 5})
        assert (await client.recv_until("pong"))["ts"] == 5


async def test_schema_errors_say_where(server: Server) -> None:
    async with joined(server) as (client, _):
        await client.send({"type": "run.start", "id": "s1", "prompt": 3})
        error = await client.recv_until("error")
        assert error["details"][0]["loc"] == ["prompt"]
        assert "prompt" in error["message"]


async def test_values_of_the_wrong_json_type_are_refused_not_coerced(server: Server) -> None:
    """Strict types: a number sent as a string, a boolean sent as a string or a number,
    an integer sent as a float are `invalid_message` (they were coerced: "2" resumed
    after seq 2, a tool's `requires_approval: "no"` turned approval off)."""
    async with joined(server) as (client, _):
        tool = {"name": "t", "parameters": {"type": "object"}}
        cases = [
            {"type": "run.start", "id": "b1", "prompt": "p",
             "tools": [{**tool, "requires_approval": "no"}]},
            {"type": "run.start", "id": "b2", "prompt": "p",
             "tools": [{**tool, "requires_approval": 0}]},
            {"type": "editor.change", "id": "b3",
             "changes": [{"from": "1", "to": 2, "insert": 0}]},
            {"type": "editor.change", "id": "b4",
             "changes": [{"from": 1.0, "to": 2, "insert": 0}]},
        ]
        for frame in cases:
            await client.send(frame)
            error = await client.recv_until("error")
            assert (error["code"], error["reply_to"]) == ("invalid_message", frame["id"]), error
    for after_seq in ("0", True, 0.0):
        async with ws_client(server.ws_url()) as late:
            await late.send({"type": "hello", "protocol": 1, "client_id": "c", "token": token(),
                             "resume": {"epoch": "e", "after_seq": after_seq}})
            refused = await late.recv()
            assert refused["code"] == "invalid_message", (after_seq, refused)
            assert refused["details"][0]["loc"] == ["resume", "after_seq"]


async def test_frame_over_the_limit_is_too_large_then_1009() -> None:
    async with running_server(max_message_bytes=4096) as srv, joined(srv) as (client, _):
        await client.send({"type": "ping", "pad": "x" * 5000})
        assert await client.expect_close() == 1009
        assert client.events[-1]["code"] == "too_large"


async def test_twenty_invalid_in_a_row_close_4400(server: Server) -> None:
    async with joined(server) as (client, _):
        for _ in range(19):
            await client.ws.send("{")
        await client.send({"type": "ping"})  # a valid message resets the streak
        for _ in range(19):
            await client.ws.send("{")
        await client.recv_until("pong")
        await client.ws.send("{")
        assert await client.expect_close() == 4400
        assert sum(1 for e in client.events if e["type"] == "error") == 39


async def test_message_rate_limit() -> None:
    async with running_server(rate_messages_per_s=5, max_invalid_messages=3) as srv, \
            joined(srv) as (client, _):
        for i in range(30):
            await client.send({"type": "ping", "id": f"p{i}"})
        replies = [await client.recv() for _ in range(30)]
        limited = [r for r in replies if r["type"] == "error"]
        assert sum(1 for r in replies if r["type"] == "pong") >= 10
        assert limited and all(r["code"] == "rate_limited" for r in limited)
        assert all(r["retry_after_ms"] > 0 and r["reply_to"].startswith("p") for r in limited)
        # rate-limited frames do not count as invalid: still open after many
        for _ in range(10):
            await client.ws.send("{")
        await asyncio.sleep(1.2)
        await client.send({"type": "ping", "id": "after"})
        assert (await client.recv_until(lambda e: e.get("reply_to") == "after" or
                                        e.get("type") == "pong"))


async def test_two_connections_see_the_same_gapless_seq(server: Server) -> None:
    async with joined(server, client_id="a") as (a, wa), \
            joined(server, sub="bob", client_id="b") as (b, _):
        start = wa["last_seq"]
        await asyncio.gather(change(a, 40), change(b, 40))
        seen_a = await seqs_until(a, start + 80)
        seen_b = await seqs_until(b, start + 80)
    assert seen_a == seen_b == list(range(start + 1, start + 81))
    users = {e["user_id"] for e in a.events if e["type"] == "document.changed"}
    assert users == {"alice", "bob"}


async def test_resume_inside_the_window_replays_exactly_the_missed_events(
    server: Server,
) -> None:
    async with joined(server, client_id="writer") as (writer, welcome):
        epoch = welcome["epoch"]
        await change(writer, 5)
        await seqs_until(writer, 5)
        async with joined(server, client_id="reader") as (reader, _):
            await change(writer, 3)
            assert await seqs_until(reader, 8) == [6, 7, 8]
        await change(writer, 4)  # missed by the reader: seq 9..12
        await seqs_until(writer, 12)
        resume = {"epoch": epoch, "after_seq": 8}
        async with joined(server, client_id="reader", resume=resume) as (reader, again):
            assert again["resumed"] is True and again["replayed"] == 4
            assert again["last_seq"] == 12
            await change(writer, 1)
            assert await seqs_until(reader, 13) == [9, 10, 11, 12, 13]


async def test_resume_with_a_wrong_epoch_or_beyond_the_log() -> None:
    async with running_server(log_max_events=5) as srv, joined(srv) as (writer, welcome):
        await change(writer, 12)
        await seqs_until(writer, 12)
        cases = [
            ({"epoch": "not-the-epoch", "after_seq": 3}, "epoch_changed"),
            ({"epoch": welcome["epoch"], "after_seq": 2}, "history_truncated"),
            ({"epoch": welcome["epoch"], "after_seq": 99}, "history_truncated"),
        ]
        last = 12
        for resume, failure in cases:
            async with joined(srv, client_id="r", resume=resume) as (reader, w):
                assert w["resumed"] is False and w["resume_failed"] == failure
                assert w["replayed"] == 0 and w["last_seq"] == last
                await change(writer, 1)
                last += 1
                assert (await reader.recv_until("document.changed"))["seq"] == last
                await seqs_until(writer, last)
        # the log keeps the last 5 events (11..15): resuming after 10 still works
        resume = {"epoch": welcome["epoch"], "after_seq": last - 5}
        async with joined(srv, client_id="r", resume=resume) as (reader, w):
            assert w["resumed"] is True and w["replayed"] == 5
            assert await seqs_until(reader, last) == list(range(last - 4, last + 1))


async def test_slow_consumer_is_closed_4009_and_resumes_without_loss() -> None:
    """~13 MB of events (a run's tool results of 900 KB each) that one tab does not
    read: it is closed 4009 before the server holds them all, and resumes where it
    stopped with nothing lost. (Bulky `document_version`s made the events before
    versions were bounded to 128 characters.)"""
    calls = 15
    prompt = script(*[{"tool_calls": [call("read_document")]}] * calls, {"say": "done"})
    async with running_server(outbound_queue_max=32, rate_messages_per_s=0) as srv, \
            joined(srv, client_id="w") as (writer, welcome):
        slow = await RawClient.connect(srv.settings.port, "/v1/documents/doc-1/ws")
        slow.send({"type": "hello", "protocol": 1, "client_id": "slow", "token": token("sam")})
        bulky = "v" * 900_000
        await start(writer, prompt)
        for _ in range(calls):  # the producer keeps up
            await answer(writer, await writer.recv_until("tool.call"), bulky)
        last = (await writer.recv_until("run.finished"))["seq"]
        events, code = await asyncio.wait_for(slow.read_until_close(), 20)
        slow.close()
        assert code == 4009
        assert events[0]["type"] == "welcome"
        got = [e["seq"] for e in events if "seq" in e]
        first = events[0]["last_seq"] + 1
        assert got == list(range(first, first + len(got))) and got[-1] < last
        resume = {"epoch": welcome["epoch"], "after_seq": got[-1]}
        async with joined(srv, sub="sam", client_id="slow", resume=resume) as (again, w):
            assert w["resumed"] is True and w["replayed"] == last - got[-1]
            rest = await seqs_until(again, last)
        assert got + rest == list(range(first, last + 1))


async def test_a_client_that_ignores_protocol_pings_is_closed() -> None:
    async with running_server(heartbeat_s=0.2) as srv:
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.settings.port)
        key = base64.b64encode(os.urandom(16)).decode()
        writer.write(
            f"GET /v1/documents/doc-1/ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            f"Sec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        assert b"101" in await reader.readline()
        # never answer the pings: the server must give up on us
        data = b""
        async with asyncio.timeout(5):
            while chunk := await reader.read(4096):
                data += chunk
        assert data.count(b"\x89") >= 1  # at least one ping frame was sent
        writer.close()


async def test_seeded_fuzz_leaves_session_and_server_working(server: Server) -> None:
    rng = random.Random(20261122)
    types = ["hello", "run.start", "tool.result", "approval", "auth.refresh", "run.cancel",
             "editor.change", "ping", "bogus", None]
    values: list[Any] = [None, 0, -1, 2**70, 1.5, "", "x" * 300, [], {}, [1, {"a": 2}],
                         {"epoch": "e", "after_seq": -3}, True, "\ud7ff\u0000"]
    fields = ["id", "run_id", "call_id", "token", "prompt", "mode", "tools", "output", "error",
              "decision", "scope", "arguments", "origin", "resume", "protocol", "context"]
    async with joined(server) as (fuzzer, _), joined(server, sub="bob", client_id="b") as (peer, _):
        for i in range(400):
            roll = rng.random()
            if roll < 0.1:
                await fuzzer.ws.send(bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 40))))
            elif roll < 0.2:
                await fuzzer.ws.send("".join(chr(rng.randint(32, 0x2FF)) for _ in range(20)))
            else:
                frame: dict[str, Any] = {}
                if (kind := rng.choice(types)) is not None:
                    frame["type"] = kind
                for name in rng.sample(fields, rng.randint(0, 5)):
                    frame[name] = rng.choice(values)
                await fuzzer.ws.send(json.dumps(frame))
            if i % 15 == 14:  # keep under the invalid-streak limit
                await fuzzer.send({"type": "ping", "id": f"k{i}"})
        await fuzzer.send({"type": "ping", "id": "final"})
        await fuzzer.recv_until(lambda e: e.get("type") == "pong", timeout=10)
        assert not any(e.get("code") == "internal" for e in fuzzer.events)
        await peer.send({"type": "editor.change", "document_version": "after-fuzz"})
        changed = await fuzzer.recv_until(
            lambda e: e.get("document_version") == "after-fuzz")
        assert changed["user_id"] == "bob"
    async with joined(server, client_id="fresh") as (_, welcome):
        assert welcome["last_seq"] >= 1
