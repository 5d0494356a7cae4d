"""A minimal OpenAI-compatible chat completions server for `make bench`.

`POST /v1/chat/completions` streams a short answer as `chat.completion.chunk`
SSE events (no pacing), `GET /v1/models` lists one model. It stands in for
an OpenAI-compatible proxy on loopback, so the cold-start row measures
cowrite's own first-call costs (imports, client set-up, connection) rather
than a provider's.
"""

import os
import time
from collections.abc import AsyncIterator

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

WORDS = ["Hello", " from", " the", " bench", " upstream", "."]


async def completions(request: Request) -> Response:
    body = await request.json()
    base = {"id": "chatcmpl-bench", "object": "chat.completion.chunk",
            "created": int(time.time()), "model": body.get("model", "m")}

    async def stream() -> AsyncIterator[bytes]:
        for word in WORDS:
            yield b"data: " + orjson.dumps({**base, "choices": [
                {"index": 0, "delta": {"content": word}, "finish_reason": None}]}) + b"\n\n"
        yield b"data: " + orjson.dumps({**base, "choices": [
            {"index": 0, "delta": {}, "finish_reason": "stop"}]}) + b"\n\n"
        yield b"data: [DONE]\n\n"

    return StreamingResponse(stream(), media_type="text/event-stream")


async def models(_: Request) -> Response:
    return JSONResponse({"object": "list", "data": [
        {"id": "bench-model", "object": "model", "created": 0, "owned_by": "bench"}]})


async def healthz(_: Request) -> Response:
    return JSONResponse({"status": "ok"})


app = Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"]),
                        Route("/v1/models", models), Route("/healthz", healthz)])

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ["COWRITE_PORT"]), log_level="warning",
                access_log=False)
