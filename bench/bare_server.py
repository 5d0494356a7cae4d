"""The baseline: a minimal Starlette WebSocket app on the same uvicorn config.

`/stream`: the client sends {"n": N, "size": S}; the server sends N JSON
frames of about S bytes. `/echo`: every frame is sent straight back.
`/healthz` for readiness. No cowrite code runs here.
"""

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
            n, size = int(command["n"]), int(command["size"])
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


async def healthz(_: Request) -> Response:
    return JSONResponse({"status": "ok"})


app = Starlette(routes=[Route("/healthz", healthz), WebSocketRoute("/stream", stream),
                        WebSocketRoute("/echo", echo)])

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ["COWRITE_PORT"]), log_level="warning",
                ws="websockets-sansio", ws_per_message_deflate=False, access_log=False)
