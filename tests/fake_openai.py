"""A local OpenAI-compatible chat completions server for the tests.

It streams `chat.completion.chunk` SSE the way real servers do, quirks
included: tool-call chunks carry `"content": ""`, `finish_reason` arrives on a
chunk of its own, usage comes last with no choices. Each request takes the
next planned reply: chunks to stream, a stall (to prove an abort closes the
upstream request: `disconnected` is set when the client goes away), an HTTP
error, or a malformed line.
"""

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.harness import QuickStopServer, free_port


@dataclass
class Reply:
    text: list[str] = field(default_factory=list)
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # {"name", "arguments"}
    stall_after_text: bool = False
    http_status: int | None = None
    malformed: bool = False
    usage: tuple[int, int] = (11, 7)
    # Misbehaving servers: the body's SSE `data:` payloads as given (each an object or a
    # raw string, `[DONE]` not added), a whole non-SSE body, an error body.
    events: list[Any] | None = None
    body: bytes | None = None
    content_type: str = "application/json"
    error_body: dict[str, Any] | None = None


class FakeOpenAI:
    def __init__(self) -> None:
        self.port = free_port()
        self.replies: list[Reply] = []
        self.requests: list[dict[str, Any]] = []
        self.peers: list[tuple[str, int]] = []  # (path, client port) of every request
        self.disconnected = asyncio.Event()
        self.stalled = asyncio.Event()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/v1/chat/completions", self._completions,
                                       methods=["POST"]),
                                 Route("/v1/models", self._models)])

    def _seen(self, request: Request) -> None:
        self.peers.append((request.url.path, request.client.port if request.client else 0))

    async def _models(self, request: Request) -> Response:
        self._seen(request)
        return JSONResponse({"object": "list", "data": [
            {"id": "test-model", "object": "model", "created": 0, "owned_by": "tests"}]})

    async def _completions(self, request: Request) -> Response:
        self._seen(request)
        body = await request.json()
        self.requests.append(body)
        reply = self.replies.pop(0) if self.replies else Reply(text=["(no reply planned)"])
        if reply.http_status is not None:
            return JSONResponse(reply.error_body or {"error": {
                "message": "planned failure", "type": "server_error"}},
                status_code=reply.http_status)
        if reply.body is not None:
            return Response(reply.body, media_type=reply.content_type)
        if reply.events is not None:
            return StreamingResponse(_raw(reply.events), media_type="text/event-stream")
        return StreamingResponse(self._stream(reply, body), media_type="text/event-stream")

    async def _stream(self, reply: Reply, body: dict[str, Any]) -> AsyncIterator[bytes]:
        base = {"id": "chatcmpl-1", "object": "chat.completion.chunk",
                "created": int(time.time()), "model": body.get("model", "m")}

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            data = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
            return b"data: " + orjson.dumps(data) + b"\n\n"

        try:
            yield chunk({"role": "assistant", "content": ""})
            for piece in reply.text:
                yield chunk({"content": piece})
                await asyncio.sleep(0)
            if reply.stall_after_text:
                self.stalled.set()
                await asyncio.sleep(3600)
            if reply.malformed:
                yield b"data: {this is not json\n\n"
            for index, tool_call in enumerate(reply.tool_calls):
                arguments = orjson.dumps(tool_call["arguments"]).decode() \
                    if not isinstance(tool_call["arguments"], str) else tool_call["arguments"]
                head, tail = arguments[: len(arguments) // 2], arguments[len(arguments) // 2:]
                yield chunk({"content": "", "tool_calls": [{
                    "index": index, "id": f"call_{index}_{len(self.requests)}", "type": "function",
                    "function": {"name": tool_call["name"], "arguments": ""}}]})
                for part in (head, tail):
                    yield chunk({"content": "", "tool_calls": [{
                        "index": index, "function": {"arguments": part}}]})
            yield chunk({}, "tool_calls" if reply.tool_calls else "stop")
            if body.get("stream_options", {}).get("include_usage"):
                prompt, completion = reply.usage
                usage = {"prompt_tokens": prompt, "completion_tokens": completion,
                         "total_tokens": prompt + completion}
                yield b"data: " + orjson.dumps({**base, "choices": [], "usage": usage}) + b"\n\n"
            yield b"data: [DONE]\n\n"
        except asyncio.CancelledError:
            self.disconnected.set()
            raise
        finally:
            if reply.stall_after_text:
                self.disconnected.set()


async def _raw(events: list[Any]) -> AsyncIterator[bytes]:
    for event in events:
        data = event.encode() if isinstance(event, str) else orjson.dumps(event)
        yield b"data: " + data + b"\n\n"


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any
          ) -> dict[str, Any]:
    """One `chat.completion.chunk` object (for `Reply.events`)."""
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return {"id": "chatcmpl-q", "object": "chat.completion.chunk", "created": 0,
            "model": "test-model", "choices": choices, **extra}


@contextlib.asynccontextmanager
async def running_fake_openai() -> AsyncIterator[FakeOpenAI]:
    fake = FakeOpenAI()
    config = uvicorn.Config(fake.app(), host="127.0.0.1", port=fake.port, log_level="warning",
                            lifespan="off")
    server = QuickStopServer(config)
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:  # noqa: ASYNC110 - uvicorn exposes a flag, not an event
            await asyncio.sleep(0.01)
        yield fake
    finally:
        server.stop()
        await asyncio.wait_for(task, 10)
