"""`DirectRoute`: the document WebSocket reaches its endpoint past Starlette's router
(server/direct_route.py), matched by the route's own rules; everything else goes on
to the router."""

from typing import Any

import httpx
import pytest
from starlette.routing import Match, WebSocketRoute
from starlette.websockets import WebSocket
from websockets.exceptions import InvalidStatus

from server.app import DOCUMENT_SOCKET
from server.direct_route import DirectRoute
from tests.harness import running_server, ws_client


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[Any] = []

    async def app(self, scope: Any, receive: Any, send: Any) -> None:
        self.calls.append(("router", scope["type"], scope["path"]))

    async def endpoint(self, ws: WebSocket) -> None:
        self.calls.append(("endpoint", ws.path_params, ws.app))


async def _nothing() -> Any:
    return {}


async def _ignore(_message: Any) -> None:
    return None


async def test_only_the_document_socket_takes_the_direct_way() -> None:
    seen = _Recorder()
    route = DirectRoute(seen.app, DOCUMENT_SOCKET, seen.endpoint)
    app = object()
    scopes: list[dict[str, Any]] = [
        {"type": "websocket", "path": "/v1/documents/doc-1/ws", "app": app},
        {"type": "websocket", "path": "/behind/v1/documents/a:b.c/ws", "root_path": "/behind",
         "app": app},
        {"type": "websocket", "path": "/v1/ai-sdk/doc-1/ws", "app": app},
        {"type": "http", "path": "/v1/documents/doc-1/ws", "app": app},
        {"type": "websocket", "path": "/v1/documents/doc-1/ws/", "app": app},
        {"type": "websocket", "path": "/behindx/v1/documents/d/ws", "root_path": "/behind",
         "app": app},
        {"type": "websocket", "path": "/behind", "root_path": "/behind", "app": app},
    ]
    for scope in scopes:
        await route(dict(scope), _nothing, _ignore)
    # The same decisions as the router's own route for that path.
    route_of_router = WebSocketRoute(DOCUMENT_SOCKET, seen.endpoint)
    direct = [call[0] == "endpoint" for call in seen.calls]
    assert direct == [route_of_router.matches(scope)[0] == Match.FULL for scope in scopes]
    assert seen.calls == [
        ("endpoint", {"document_id": "doc-1"}, app),
        ("endpoint", {"document_id": "a:b.c"}, app),
        ("router", "websocket", "/v1/ai-sdk/doc-1/ws"),
        ("router", "http", "/v1/documents/doc-1/ws"),
        ("router", "websocket", "/v1/documents/doc-1/ws/"),
        ("router", "websocket", "/behindx/v1/documents/d/ws"),
        ("router", "websocket", "/behind"),
    ]


async def test_a_document_id_the_protocol_refuses_is_still_a_404() -> None:
    async with running_server() as srv:
        for bad in ("a/b", "x" * 129, "sp%20ace"):
            with pytest.raises(InvalidStatus) as refused:  # the handshake's HTTP answer
                async with ws_client(srv.ws_url(bad)):
                    pass
            assert refused.value.response.status_code == 404
        async with httpx.AsyncClient() as http:  # plain HTTP to the socket's path: the router's
            assert (await http.get(f"{srv.http}/v1/documents/doc-1/ws")).status_code == 404
