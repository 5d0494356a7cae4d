"""The document WebSocket handed straight to its endpoint, past Starlette's router.

Starlette reaches a WebSocket endpoint through its exception middleware, the
router, the route and two exception-handling wrappers: eight coroutine frames
that stay suspended under every open connection for its whole life, and that
are resumed, one inside the other, every time a frame arrives. The document
socket needs none of them: what those wrappers handle for a WebSocket is a
`WebSocketException` or `HTTPException` raised by the endpoint (turned into a
close or a denial response), and `document_socket` raises neither: it answers
a refused handshake and closes by itself on every path. (Anything else it
raised went through to uvicorn before, and still does.)
This middleware matches the route's own path (Starlette's `compile_path`,
so the same `{document_id:path}` rule and root path) and calls the endpoint
with the `WebSocket` the route would have built; every other scope goes on
to the router unchanged. Like `TransportHandle`, `__call__` returns the
endpoint's awaitable rather than awaiting it, so it adds no frame itself.
"""

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.routing import compile_path
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocket


class DirectRoute:
    def __init__(self, app: ASGIApp, path: str,
                 endpoint: Callable[[WebSocket], Awaitable[None]]) -> None:
        self.app = app
        self.pattern, _, self.convertors = compile_path(path)
        self.endpoint = endpoint

    def __call__(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        if scope["type"] == "websocket":
            match = self.pattern.match(_route_path(scope))
            if match is not None:
                params: dict[str, Any] = {name: self.convertors[name].convert(value)
                                          for name, value in match.groupdict().items()}
                scope["path_params"] = {**scope.get("path_params", {}), **params}
                return self.endpoint(WebSocket(scope, receive=receive, send=send))
        return self.app(scope, receive, send)


def _route_path(scope: Scope) -> str:
    """The path the router matches: without the root path when the app is mounted
    below one (Starlette's own rule, `starlette._utils.get_route_path`, which is
    private, hence this copy)."""
    path: str = scope["path"]
    root_path: str = scope.get("root_path", "")
    if root_path and path.startswith(root_path) and path[len(root_path):][:1] in ("", "/"):
        return path[len(root_path):]
    return path


__all__ = ["DirectRoute"]
