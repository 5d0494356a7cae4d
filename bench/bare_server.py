"""The baseline: a minimal Starlette WebSocket app on the same uvicorn config.

`/stream`: the client sends {"n": N, "size": S}; the server sends N JSON
frames of about S bytes. `/echo`: every frame is sent straight back.
`/abortable`: like a cowrite document, a `run.start` starts a stream of
`message.delta` frames (8 characters every 5 ms); any other frame stops it
and is answered `run.finished` (the bare cost of an abort).
`/tool`: like a cowrite tool round trip without the agent: every frame (a
`tool.result`) is parsed and answered with the three frames cowrite sends for
it (`tool.done`, the `ack`, the next `tool.call`), for the floor of the same
traffic in this stack.
`/healthz` for readiness. No cowrite code runs here.
"""

import asyncio
import contextlib
import os

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect


async def stream(ws: WebSocket) -> None:
    await ws.accept()
    try:
        while True:
            command = orjson.loads(await ws.receive_text())
            n, size = int(command["n"]), int(command.get("size", 0))
            if "delta" in command:  # frames shaped like cowrite's deltas, this text each
                delta = str(command["delta"])
                for i in range(n):
                    await ws.send_text(orjson.dumps({
                        "type": "message.delta", "run_id": "run_0123456789abcdef",
                        "message_id": "msg_0123456789abcdef", "delta": delta, "seq": i + 1,
                        "ts": 1_700_000_000_000}).decode())
                continue
            for i in range(n):
                frame = orjson.dumps({"type": "message.delta", "seq": i, "run_id": "r",
                                      "message_id": "m", "ts": 0, "delta": ""})
                pad = max(0, size - len(frame))
                await ws.send_text(orjson.dumps({"type": "message.delta", "seq": i,
                                                 "run_id": "r", "message_id": "m", "ts": 0,
                                                 "delta": "x" * pad}).decode())
    except WebSocketDisconnect:
        pass


async def echo(ws: WebSocket) -> None:
    await ws.accept()
    try:
        while True:
            await ws.send_text(await ws.receive_text())
    except WebSocketDisconnect:
        pass


async def tool(ws: WebSocket) -> None:
    await ws.accept()
    seq = 0
    try:
        while True:
            result = orjson.loads(await ws.receive_text())
            call_id = str(result.get("call_id", "call_0"))
            seq += 2
            await ws.send_text(orjson.dumps({
                "type": "tool.done", "run_id": "run_0123456789abcdef", "call_id": call_id,
                "status": "ok", "output": result.get("output"), "seq": seq - 1,
                "ts": 1_700_000_000_000}).decode())
            await ws.send_text(orjson.dumps({
                "type": "ack", "run_id": "run_0123456789abcdef", "call_id": call_id,
                "status": "accepted"}).decode())
            await ws.send_text(orjson.dumps({
                "type": "tool.call", "run_id": "run_0123456789abcdef",
                "call_id": f"call_{seq:010d}", "name": "read_document", "arguments": {},
                "executor": "client", "client_id": "executor", "token": "t" * 120,
                "expires_at": 1_700_000_060_000, "seq": seq, "ts": 1_700_000_000_000}).decode())
    except WebSocketDisconnect:
        pass


async def _deltas(ws: WebSocket) -> None:
    seq = 0
    while True:
        await asyncio.sleep(0.005)
        seq += 1
        await ws.send_text(orjson.dumps({"type": "message.delta", "seq": seq, "run_id": "r",
                                         "message_id": "m", "ts": 0,
                                         "delta": "lorem ip"}).decode())


async def abortable(ws: WebSocket) -> None:
    await ws.accept()
    streaming: asyncio.Task[None] | None = None
    try:
        while True:
            message = orjson.loads(await ws.receive_text())
            if message.get("type") == "run.start":
                streaming = asyncio.create_task(_deltas(ws))
            elif streaming is not None:
                streaming.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await streaming
                streaming = None
                await ws.send_text('{"type":"run.finished","status":"aborted"}')
    except WebSocketDisconnect:
        pass
    finally:
        if streaming is not None:
            streaming.cancel()


async def healthz(_: Request) -> Response:
    return JSONResponse({"status": "ok"})


app = Starlette(routes=[Route("/healthz", healthz), WebSocketRoute("/stream", stream),
                        WebSocketRoute("/echo", echo), WebSocketRoute("/tool", tool),
                        WebSocketRoute("/abortable", abortable)])

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ["COWRITE_PORT"]), log_level="warning",
                ws="websockets-sansio", ws_per_message_deflate=False, access_log=False)
