"""The architecture cowrite replaces, as a baseline: the server streams tool
calls over Server-Sent Events and the client answers each with an HTTP POST.

`GET /events?session=S` streams `data: {"call": n}` events; `POST /result`
with `{"session": S, "call": n}` makes the server stream call n + 1. It runs
on the same uvicorn settings (httptools, uvloop when present).
"""

import asyncio
import os
from collections import defaultdict
from collections.abc import AsyncIterator

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

queues: dict[str, asyncio.Queue[int]] = defaultdict(asyncio.Queue)


async def events(request: Request) -> Response:
    session = request.query_params["session"]

    async def stream() -> AsyncIterator[bytes]:
        queue = queues[session]
        yield b"data: " + orjson.dumps({"call": 0}) + b"\n\n"
        while True:
            n = await queue.get()
            yield b"data: " + orjson.dumps({"call": n, "name": "read_document",
                                             "arguments": {}}) + b"\n\n"

    return StreamingResponse(stream(), media_type="text/event-stream")


async def result(request: Request) -> Response:
    body = orjson.loads(await request.body())
    queues[body["session"]].put_nowait(int(body["call"]) + 1)
    return JSONResponse({"ok": True})


async def healthz(_: Request) -> Response:
    return JSONResponse({"status": "ok"})


app = Starlette(routes=[Route("/healthz", healthz), Route("/events", events),
                        Route("/result", result, methods=["POST"])])

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ["COWRITE_PORT"]), log_level="warning",
                access_log=False)
