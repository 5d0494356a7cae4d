"""Issue 11 and PROTOCOL.md section 10 at the socket: deep frames, 64-bit
integers, auth error texts, /metrics access, call tokens per user, the cap
on sockets before hello."""

import asyncio
import contextlib
from typing import Any

import httpx
import jwt
import orjson
import pytest

from tests.harness import (
    SECRET,
    Client,
    RawClient,
    Server,
    joined,
    running_server,
    token,
    ws_client,
)
from tests.runs import READ, answer, call, script, start

DEPTHS = [65, 100, 1000, 5000]

# (message, where the deep value goes, levels that path adds): every object-valued
# field of every message type, and a scalar field of the types that have none.
PLACEMENTS: list[tuple[dict[str, Any], list[str | int], int]] = [
    ({"type": "run.start", "prompt": "p"}, ["context"], 1),
    ({"type": "run.start", "prompt": "p", "context": {}}, ["context", "selection"], 2),
    ({"type": "run.start", "prompt": "p", "context": {}}, ["context", "extra"], 2),
    ({"type": "run.start", "prompt": "p", "context": {"document": {"text": "t"}}},
     ["context", "document", "version"], 3),
    ({"type": "run.start", "prompt": "p"}, ["tools"], 1),
    ({"type": "run.start", "prompt": "p", "tools": [{"name": "t"}]},
     ["tools", 0, "parameters"], 3),
    ({"type": "run.start", "prompt": "p"}, ["options"], 1),
    ({"type": "tool.result", "run_id": "r", "call_id": "c", "token": "t"}, ["output"], 1),
    ({"type": "tool.result", "run_id": "r", "call_id": "c", "token": "t"}, ["error"], 1),
    ({"type": "approval", "run_id": "r", "call_id": "c", "decision": "approve"},
     ["arguments"], 1),
    ({"type": "auth.refresh"}, ["token"], 1),
    ({"type": "run.cancel", "run_id": "r"}, ["reason"], 1),
    ({"type": "editor.change"}, ["summary"], 1),
    ({"type": "editor.change"}, ["document_version"], 1),
    ({"type": "ping"}, ["ts"], 1),
]


def deep_frame(message: dict[str, Any], path: list[str | int], path_levels: int,
               depth: int) -> str:
    """`message` with a value at `path` so that the whole frame nests `depth` levels."""
    marker = "__DEEP__"
    data = orjson.loads(orjson.dumps(message))
    target: Any = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = marker
    inner = depth - path_levels
    text = orjson.dumps({**data, "id": "deep"}).decode()
    return text.replace(f'"{marker}"', "[" * inner + "]" * inner)


async def pong(client: Client, stamp: int) -> None:
    await client.send({"type": "ping", "ts": stamp})
    await client.recv_until(lambda e: e["type"] == "pong" and e.get("ts") == stamp)


async def test_deep_frames_in_every_field_are_invalid_and_not_acted_on(server: Server) -> None:
    async with joined(server) as (client, welcome), \
            joined(server, sub="bob", client_id="b") as (peer, _):
        for index, (message, path, levels) in enumerate(PLACEMENTS):
            for depth in DEPTHS:
                await client.ws.send(deep_frame(message, path, levels, depth))
                error = await client.recv_until(lambda e: e["type"] == "error")
                assert error["code"] == "invalid_message", (message, path, depth, error)
                assert "64 levels" in error["message"] and error["details"][0]["max_depth"] == 64
                if depth <= 1024:  # orjson can still read the id of a frame this deep
                    assert error["reply_to"] == "deep"
                await pong(client, index * 10_000 + depth)  # the session goes on
        await peer.send({"type": "editor.change", "document_version": "after"})
        changed = await client.recv_until("document.changed")
    # nothing any deep frame asked for happened: the only durable event is the peer's edit
    assert changed["seq"] == welcome["last_seq"] + 1 and changed["document_version"] == "after"
    assert not any(e.get("type") == "run.started" for e in client.events)


async def test_a_frame_at_the_depth_limit_is_accepted(server: Server) -> None:
    async with joined(server) as (client, _):
        await client.ws.send(deep_frame({"type": "editor.change"}, ["document_version"], 1, 64))
        error = await client.recv_until("error")
        assert error["code"] == "invalid_message" and "document_version" in error["message"]
        assert "levels" not in error["message"]  # refused by the schema, not by the depth


@pytest.mark.parametrize("depth", DEPTHS)
async def test_a_deep_hello_is_invalid_then_4001(server: Server, depth: int) -> None:
    hello = {"type": "hello", "protocol": 1, "client_id": "t", "token": token()}
    async with ws_client(server.ws_url()) as client:
        await client.ws.send(deep_frame(hello, ["resume"], 1, depth))
        assert await client.expect_close() == 4001
    assert client.events[0]["code"] == "invalid_message"
    assert "64 levels" in client.events[0]["message"]


async def test_deep_frames_count_toward_the_invalid_streak(server: Server) -> None:
    async with joined(server) as (client, _):
        for _ in range(20):
            await client.ws.send(deep_frame({"type": "ping"}, ["ts"], 1, 100))
        assert await client.expect_close() == 4400


async def test_integers_beyond_64_bits_are_invalid_message(server: Server) -> None:
    async with joined(server) as (client, welcome), \
            joined(server, sub="bob", client_id="b") as (peer, _):
        for frame in ('{"type":"ping","id":"i1","ts":18446744073709551616}',
                      '{"type":"editor.change","id":"i2","document_version":18446744073709551616}',
                      '{"type":"ping","id":"i3","ts":-9223372036854775809}'):
            await client.ws.send(frame)
            error = await client.recv_until("error")
            assert error["code"] == "invalid_message" and "64-bit" in error["message"]
            assert error["reply_to"] == frame.split('"id":"')[1][:2]
        await client.send({"type": "editor.change", "document_version": 2**63 - 1})
        changed = await peer.recv_until("document.changed")
        assert changed["document_version"] == 2**63 - 1
        assert changed["seq"] == welcome["last_seq"] + 1  # the refused edit was never logged


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (lambda: token(ttl_s=-10), "token expired"),
        (lambda: token(secret="some-other-secret-0123456789abcdef01"), "bad signature"),
        (lambda: "not.a.jwt", "malformed token"),
        (lambda: jwt.encode({"sub": "a", "docs": ["*"]}, SECRET, algorithm="HS256"),
         "token lacks the required 'exp' claim"),
    ],
    ids=["expired", "signature", "malformed", "no-exp"],
)
async def test_auth_errors_say_what_is_wrong_in_our_words(server: Server, given: Any,
                                                          expected: str) -> None:
    async with ws_client(server.ws_url()) as client:
        await client.send({"type": "hello", "protocol": 1, "client_id": "t", "token": given()})
        assert await client.expect_close() == 4001
    assert client.events[0]["code"] == "invalid_token"
    assert client.events[0]["message"] == expected
    async with joined(server) as (client, _):
        await client.send({"type": "auth.refresh", "id": "r", "token": given()})
        error = await client.recv_until("error")
        assert error["code"] == "invalid_token" and error["message"] == expected


async def test_wrong_audience_is_named() -> None:
    async with running_server(jwt_audience="cowrite") as srv:
        async with ws_client(srv.ws_url()) as client:
            await client.send({"type": "hello", "protocol": 1, "client_id": "t",
                               "token": token(aud="elsewhere")})
            assert await client.expect_close() == 4001
        assert client.events[0]["message"] == "wrong audience"


async def test_metrics_are_public_without_a_token(server: Server) -> None:
    async with httpx.AsyncClient(base_url=server.http) as http:
        response = await http.get("/metrics")
    assert response.status_code == 200 and "cowrite_connections_open" in response.text


async def test_metrics_need_the_bearer_token_when_one_is_set() -> None:
    async with running_server(metrics_token="scrape-me") as srv, \
            httpx.AsyncClient(base_url=srv.http) as http:
        assert (await http.get("/metrics")).status_code == 401
        wrong = await http.get("/metrics", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and "cowrite_" not in wrong.text
        right = await http.get("/metrics", headers={"Authorization": "Bearer scrape-me"})
        assert right.status_code == 200 and "cowrite_connections_open" in right.text


async def test_metrics_on_their_own_port() -> None:
    from tests.harness import free_port

    port = free_port()
    async with running_server(metrics_port=port, metrics_token="t0k") as srv, \
            httpx.AsyncClient() as http:
        assert (await http.get(f"{srv.http}/metrics",
                               headers={"Authorization": "Bearer t0k"})).status_code == 404
        own = f"http://127.0.0.1:{port}/metrics"
        assert (await http.get(own)).status_code == 401
        response = await http.get(own, headers={"Authorization": "Bearer t0k"})
        assert response.status_code == 200 and "cowrite_connections_open" in response.text
        assert (await http.get(f"{srv.http}/healthz")).status_code == 200


async def test_call_tokens_reach_only_the_runs_user_live_and_on_resume(server: Server) -> None:
    prompt = script({"tool_calls": [call("read_document")]}, {"say": "done"})
    async with joined(server, client_id="a1") as (alice, welcome), \
            joined(server, client_id="a2") as (alice2, _), \
            joined(server, sub="bob", client_id="b") as (bob, _):
        await start(alice, prompt, tools=[READ])
        mine = await alice.recv_until("tool.call")
        other_tab = await alice2.recv_until("tool.call")
        theirs = await bob.recv_until("tool.call")
        assert mine["token"] and other_tab["token"] == mine["token"]
        assert "token" not in theirs
        assert {k: v for k, v in mine.items() if k != "token"} == theirs
        await answer(alice, mine, output={"text": "doc"})
        await bob.recv_until("run.finished")
    everything = {"epoch": welcome["epoch"], "after_seq": 0}
    async with joined(server, sub="bob", client_id="b", resume=everything) as (again, w):
        assert w["resumed"] is True
        replayed = await again.recv_until("tool.call")
        assert "token" not in replayed and replayed["call_id"] == mine["call_id"]
    async with joined(server, client_id="a1", resume=everything) as (again, w):
        assert (await again.recv_until("tool.call"))["token"] == mine["token"]


@pytest.mark.slow
async def test_sockets_that_never_say_hello_make_room_for_new_ones() -> None:
    """Beyond the cap the oldest silent socket is closed, not the new one refused (a
    flood of tokenless sockets kept every user out with 503): a client that says
    hello right away gets in while 300 silent sockets keep coming."""
    async with running_server(hello_timeout_s=60) as srv:
        limit = srv.settings.max_pending_handshakes
        assert limit == 256
        silent: list[RawClient] = []
        try:
            for _ in range(300):
                silent.append(await RawClient.connect(srv.settings.port,
                                                      "/v1/documents/doc-1/ws"))
            for old in silent[:300 - limit]:  # the oldest 44 were closed to make room
                _, code = await asyncio.wait_for(old.read_until_close(), 5)
                assert code is None
            async with joined(srv, client_id="real") as (_, welcome):  # not refused
                assert welcome["type"] == "welcome"
            newest = silent[-1]  # still waiting for its hello
            newest.send({"type": "hello", "protocol": 1, "client_id": "t", "token": token()})
            opcode, payload = await asyncio.wait_for(newest.read_frame(), 5)
            assert opcode == 1 and orjson.loads(payload)["type"] == "welcome"
        finally:
            for client in silent:
                with contextlib.suppress(Exception):
                    client.close()
