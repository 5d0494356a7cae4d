"""What a peer without a token, or with only a viewer's, can make the adapters do (from a
security review; each case was reproduced first): hold memory and sockets, hold the
handshake slots, cancel a run it may only watch."""

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
from websockets.exceptions import ConnectionClosed

from tests.harness import Server, joined, running_server, token, ws_client
from tests.runs import script


async def _raw_post(server: Server, path: str, body_size: int, sent: int) -> bytes:
    """A POST that declares `body_size` bytes and sends `sent` of them; the answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.settings.port)
    try:
        writer.write(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {body_size}\r\n\r\n".encode() + b" " * sent)
        await writer.drain()
        return await asyncio.wait_for(reader.read(4096), 5)
    finally:
        writer.close()


async def test_agui_looks_at_the_token_before_reading_the_body(server: Server) -> None:
    # The body (up to the size limit) was read, with no deadline, before the token was
    # looked at: 300 such requests held 350 MB and 300 sockets, unanswered.
    answer = await _raw_post(server, "/v1/agui/doc-1", 1_000_000, 1_000)
    assert answer.startswith(b"HTTP/1.1 401")


async def test_a_body_that_does_not_arrive_in_time_is_408(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    from server.adapters import http as adapter_http

    monkeypatch.setattr(adapter_http, "BODY_TIMEOUT_S", 0.5)
    async with running_server() as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.settings.port)
        writer.write(b"POST /v1/agui/doc-1 HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n"
                     b"Authorization: Bearer " + token().encode() + b"\r\n\r\n{")
        answer = await asyncio.wait_for(reader.read(4096), 5)
        writer.close()
    assert answer.startswith(b"HTTP/1.1 408")


async def test_an_ai_sdk_socket_with_no_token_is_closed_and_holds_a_handshake_slot() -> None:
    async with running_server(hello_timeout_s=0.5, max_pending_handshakes=1) as server:
        base = f"ws://127.0.0.1:{server.settings.port}/v1/ai-sdk/doc-1/ws"
        async with ws_client(base) as first, ws_client(base) as second:
            # one slot: the second socket makes room by closing the first
            with pytest.raises(ConnectionClosed):
                await asyncio.wait_for(first.ws.recv(), 5)
            with pytest.raises(ConnectionClosed):  # kept for ever before
                await asyncio.wait_for(second.ws.recv(), 5)
            assert second.ws.close_code == 4001
        async with ws_client(f"{base}?token={token()}") as good:
            await good.ws.send(orjson.dumps({"type": "resume", "requestId": "r",
                                             "id": "chat-1"}).decode())
            assert orjson.loads(await good.ws.recv())["type"] == "no-active"
            await asyncio.sleep(1)  # past the deadline: authenticated sockets stay
            await good.ws.send(orjson.dumps({"type": "resume", "requestId": "r2",
                                             "id": "chat-1"}).decode())
            assert orjson.loads(await good.ws.recv())["type"] == "no-active"


async def test_garbage_frames_on_an_ai_sdk_socket_close_it_4400() -> None:
    async with running_server(max_invalid_messages=5) as server:
        url = f"ws://127.0.0.1:{server.settings.port}/v1/ai-sdk/doc-1/ws?token={token()}"
        async with ws_client(url) as client:
            for _ in range(5):
                await client.ws.send("{not json")
            with pytest.raises(ConnectionClosed):
                await asyncio.wait_for(client.ws.recv(), 5)
            assert client.ws.close_code == 4400


def _slow_send(chat_id: str) -> dict[str, Any]:
    """A WebSocket transport's `send` of a prompt that streams for about a second."""
    slow = script({"say": "x" * 60}, chunk_chars=1, delay_ms=20)
    return {"type": "send", "requestId": "s", "id": chat_id, "trigger": "submit-message",
            "messages": [{"id": "m", "role": "user", "parts": [{"type": "text", "text": slow}]}]}


async def test_a_viewers_abort_stops_its_stream_but_not_the_run(server: Server) -> None:
    base = f"ws://127.0.0.1:{server.settings.port}/v1/ai-sdk/doc-v/ws"
    send = _slow_send("chat-v")
    async with ws_client(f"{base}?token={token('alice')}") as editor, \
            ws_client(f"{base}?token={token('alice', role='viewer')}") as viewer, \
            joined(server, "doc-v", client_id="w") as (tab, _):
        await editor.ws.send(orjson.dumps(send).decode())
        await tab.recv_until("run.started")
        await viewer.ws.send(orjson.dumps({"type": "resume", "requestId": "v",
                                           "id": "chat-v"}).decode())
        while orjson.loads(await viewer.ws.recv())["type"] != "start":
            pass
        await viewer.ws.send(orjson.dumps({"type": "abort", "requestId": "v"}).decode())
        finished = await tab.recv_until("run.finished", timeout=10)
        assert finished["status"] == "completed"  # was cancelled/user_cancelled
        while orjson.loads(await editor.ws.recv())["type"] != "end":
            pass  # read: a client that leaves frames unread waits 10 s to close


async def test_an_abort_of_a_resume_stops_that_stream_not_the_run(server: Server) -> None:
    """The AI SDK aborts a `resume` that a newer one replaces (a remount, StrictMode's
    second effect): that cancelled the run for everyone."""
    url = f"ws://127.0.0.1:{server.settings.port}/v1/ai-sdk/doc-r/ws?token={token('alice')}"
    send = _slow_send("chat-r")
    async with ws_client(url) as first, ws_client(url) as second, \
            joined(server, "doc-r", client_id="w") as (tab, _):
        await first.ws.send(orjson.dumps(send).decode())
        await tab.recv_until("run.started")
        for request in ("r1", "r2"):
            await second.ws.send(orjson.dumps({"type": "resume", "requestId": request,
                                               "id": "chat-r"}).decode())
            while orjson.loads(await second.ws.recv())["type"] != "start":
                pass
        await second.ws.send(orjson.dumps({"type": "abort", "requestId": "r1"}).decode())
        finished = await tab.recv_until("run.finished", timeout=10)
        assert finished["status"] == "completed"  # was cancelled/user_cancelled
        frame = orjson.loads(await second.ws.recv())
        while frame["type"] != "end":
            frame = orjson.loads(await second.ws.recv())
        assert frame["requestId"] == "r2"  # the newer resume followed the run to its end
        while orjson.loads(await first.ws.recv())["type"] != "end":
            pass  # read: a client that leaves frames unread waits 10 s to close


async def test_the_dev_token_needs_a_loopback_host_a_json_body_and_no_other_origin() -> None:
    """A loopback peer was enough: a page rebound to 127.0.0.1 (DNS rebinding), or a
    cross-site `text/plain` POST, got a token for every document."""
    async with running_server(dev=True) as server, httpx.AsyncClient(base_url=server.http) as http:
        body = orjson.dumps({"user": "eve"})
        json_type = {"content-type": "application/json"}
        assert (await http.post("/v1/dev/token", content=body, headers=json_type)
                ).status_code == 200
        refused = [
            {**json_type, "host": "evil.example"},
            {"content-type": "text/plain"},
            {**json_type, "origin": "http://evil.example"},
        ]
        for headers in refused:
            answer = await http.post("/v1/dev/token", content=body, headers=headers)
            assert answer.status_code == 403 and "token" not in answer.json(), headers
        same_site = {**json_type, "origin": server.http}
        assert (await http.post("/v1/dev/token", content=body, headers=same_site)
                ).status_code == 200


async def test_a_dev_token_body_past_64_kib_is_refused_unread() -> None:
    """The dev token's body was read whole, whatever its size (chunked, no length)."""
    async with running_server(dev=True) as server, httpx.AsyncClient(base_url=server.http) as http:
        async def endless() -> AsyncIterator[bytes]:
            for _ in range(4096):  # 256 MiB if it were all read
                yield b" " * 65_536

        answer = await http.post("/v1/dev/token", content=endless(),
                                 headers={"content-type": "application/json"})
        assert answer.status_code == 413 and "larger than 65536 bytes" in answer.json()["error"]
        small = await http.post("/v1/dev/token", content=orjson.dumps({"user": "eve"}),
                                headers={"content-type": "application/json"})
        assert small.status_code == 200 and small.json()["token"]


async def test_a_dev_token_body_that_does_not_arrive_in_time_is_408(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A dev token body trickled a byte at a time held its socket for ever."""
    from server.adapters import http as adapter_http

    monkeypatch.setattr(adapter_http, "BODY_TIMEOUT_S", 0.5)
    async with running_server(dev=True) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.settings.port)
        writer.write(b"POST /v1/dev/token HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
        answer = await asyncio.wait_for(reader.read(4096), 5)
        writer.close()
    assert answer.startswith(b"HTTP/1.1 408") and b"not received within 0.5 s" in answer
