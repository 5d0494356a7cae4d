"""`create_app(settings)`: routes, lifespan and the objects behind them."""

import asyncio
import hmac
import ipaddress
import mimetypes
import re
import socket
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, Field, ValidationError
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles

from protocol.base import DEFAULT_THREAD, THREAD_ID_PATTERN
from protocol.schema import build_schema
from protocol.server import Limits
from server import tracing
from server.adapters import http as http_edge
from server.adapters.agui import post_agui
from server.adapters.ai_sdk import get_chat_stream, post_chat
from server.adapters.ai_sdk_ws import ai_sdk_socket
from server.adapters.chat import ChatRuns
from server.adapters.http import internal_error
from server.adapters.tool_results import post_tool_result
from server.agent.coordinator import RunCoordinator
from server.agent.environment import RunEnvironment
from server.agent.factory import make_llm
from server.agent.history import thread_of, threads
from server.agent.llm import Warmable
from server.agent.machine import RunMachine
from server.agent.remote import RunRouter
from server.agent.steps import MachineConfig
from server.auth import Authenticator, AuthError, Principal
from server.backends.base import Backend, BackendUnavailable
from server.backends.memory import HISTORY_MAX_ENTRIES, MemoryBackend
from server.direct_route import DirectRoute
from server.endpoint import DOCUMENT_ID_RE, document_socket
from server.limits import HandshakeGate, UserBuckets
from server.observability import Metrics, configure_logging
from server.runner import MetricsServer, metrics_config
from server.services import Services
from server.session import DocumentSession
from server.session_hub import SessionHub
from server.settings import Settings
from server.tools.catalog import ToolCatalog
from server.tools.factory import build_catalog
from server.transport import TransportHandle

THREAD_ID_RE = re.compile(THREAD_ID_PATTERN)
LIMIT_RE = re.compile(r"[0-9]{1,6}")
HISTORY_LIMIT_MAX = HISTORY_MAX_ENTRIES  # a document keeps no more than this
STATIC_DIR = Path(__file__).resolve().parent.parent / "static"
# The client's type declarations (`client.d.ts`): Debian's mime.types names `.ts` Qt's
# translation files (`text/vnd.trolltech.linguist`), which browsers offer to download.
mimetypes.add_type("application/typescript", ".ts")
DOCUMENT_SOCKET = "/v1/documents/{document_id:path}/ws"


class DevTokenRequest(BaseModel):
    user: str = Field(min_length=1, max_length=128)
    docs: list[str] = Field(default_factory=lambda: ["*"])
    role: Literal["editor", "viewer"] = "editor"
    ttl_s: float = Field(default=3600.0, gt=0, le=86400)


def make_backend(settings: Settings) -> Backend:
    if settings.redis_url:
        from server.backends.redis import RedisBackend

        return RedisBackend(settings.redis_url, log_max_events=settings.log_max_events)
    return MemoryBackend(log_max_events=settings.log_max_events, idle_s=settings.memory_idle_s,
                         max_documents=settings.memory_max_documents)


# The protocol 1.1 additions this server supports (welcome.features).
FEATURES = ("json_depth", "edit_scope", "run_queue", "server_tools", "mcp", "workflows",
            "threads",
            "http_tool_results", "ai_sdk", "ag_ui")


def build_services(settings: Settings, tools: ToolCatalog | None = None) -> Services:
    backend = make_backend(settings)
    limits = Limits(
        max_message_bytes=settings.max_message_bytes,
        tool_timeout_s=settings.tool_timeout_s,
        run_timeout_s=settings.run_timeout_s,
        max_steps=settings.max_steps,
    )
    auth, metrics, instance_id = Authenticator(settings), Metrics(), uuid.uuid4().hex[:12]
    durable = settings.durable_runs and bool(settings.redis_url)  # section 13
    machine = RunMachine(MachineConfig(
        signer=auth, tool_timeout_s=settings.tool_timeout_s,
        approval_timeout_s=settings.approval_timeout_s, run_timeout_s=settings.run_timeout_s,
        client_grace_s=settings.client_grace_s, checkpoint_steps=durable))

    def session_factory(document_id: str) -> DocumentSession:
        def runs(session: DocumentSession) -> RunCoordinator:
            return RunCoordinator(document_id, session, session, env,
                                  on_idle=lambda: hub.forget_if_idle(session))
        return DocumentSession(document_id, backend, limits, runs,
                               FEATURES + (("durable_runs",) if durable else ()))

    if isinstance(backend, MemoryBackend):
        metrics.watch_memory_documents(lambda: backend.document_count)
    hub = SessionHub(session_factory)
    router = RunRouter(backend, hub, machine, metrics, instance_id, settings.run_lease_s,
                       settings.run_timeout_s, durable=durable,
                       janitor_interval_s=settings.janitor_interval_s)
    env = RunEnvironment(settings=settings, registry=backend, cluster=router,
                         llm=make_llm(settings), machine=machine, metrics=metrics,
                         instance_id=instance_id, tools=tools)
    return Services(settings=settings, backend=backend, auth=auth, metrics=metrics, hub=hub,
                    runs=env, router=router, instance_id=instance_id)


def _is_loopback(request: Request) -> bool:
    host = request.client.host if request.client else ""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _loopback_name(host: str) -> bool:
    """`localhost`, `127.0.0.1`, `[::1]`, with or without a port."""
    if host.startswith("["):  # [::1] or [::1]:8000
        name = host[1:host.find("]")] if "]" in host else ""
    else:
        name = host.split(":", 1)[0]
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _dev_request_is_local(request: Request) -> bool:
    """A loopback peer is not enough: a page whose DNS name was rebound to 127.0.0.1 is
    one, and a cross-site `text/plain` POST needs no preflight. So the Host must be a
    loopback name, the body declared JSON, and an Origin, if sent, this server's."""
    host = request.headers.get("host", "")
    origin = request.headers.get("origin")
    json_body = request.headers.get("content-type", "").split(";")[0].strip().lower() == \
        "application/json"
    return _loopback_name(host) and json_body and (
        origin is None or origin in (f"http://{host}", f"https://{host}"))


DEV_TOKEN_BODY_MAX = 65_536


async def _small_body(request: Request, limit: int) -> bytes | None:
    """The body, or None once it passes `limit` bytes (the rest is not read: a dev
    token request is a few hundred bytes, and a body of any size was held in memory).
    TimeoutError when it has not all arrived within BODY_TIMEOUT_S (a trickled body
    held its socket for ever), as the adapters' bodies."""
    body = bytearray()
    async with asyncio.timeout(http_edge.BODY_TIMEOUT_S):
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                return None
    return bytes(body)


def _json(data: Any, status_code: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status_code, media_type="application/json")


def create_app(settings: Settings | None = None, *,
               metrics_sockets: list[socket.socket] | None = None) -> Starlette:
    """`metrics_sockets`: the `COWRITE_METRICS_PORT` listeners `python -m server` bound
    up front (`runner.bind_metrics`); without them the lifespan binds the port itself."""
    settings = settings or Settings()
    configure_logging(settings.json_logs, settings.log_level)
    tracing.configure(settings)
    tools: ToolCatalog = build_catalog(settings)  # ConfigError: refuse to start
    services = build_services(settings, tools)
    schema = orjson.dumps(build_schema())
    chat_runs = ChatRuns(services)

    async def healthz(_: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(_: Request) -> Response:
        ok = await services.backend.ready()
        return JSONResponse({"status": "ok" if ok else "unavailable"}, 200 if ok else 503)

    metrics_token = (settings.metrics_token.get_secret_value().encode()
                     if settings.metrics_token else None)

    async def metrics(request: Request) -> Response:
        """Prometheus text; with COWRITE_METRICS_TOKEN, only for that Bearer token."""
        if metrics_token is not None:
            scheme, _, given = request.headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(
                    given.strip().encode(), metrics_token):
                return Response("metrics need the bearer token\n", status_code=401,
                                headers={"WWW-Authenticate": 'Bearer realm="metrics"'},
                                media_type="text/plain")
        return Response(generate_latest(services.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def not_here(_: Request) -> Response:
        return _json({"error": "not found"}, 404)

    async def protocol_schema(_: Request) -> Response:
        return Response(schema, media_type="application/schema+json")

    def bearer(request: Request) -> Principal | Response:
        """The caller's principal, or the 401 response for a bad or missing token."""
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        try:
            if scheme.lower() != "bearer":
                raise AuthError("missing bearer token")
            return services.auth.verify(token.strip())
        except AuthError as exc:  # the challenge the adapters' and /metrics' 401s carry
            return Response(orjson.dumps({"error": str(exc)}), status_code=401,
                            media_type="application/json",
                            headers={"WWW-Authenticate": 'Bearer realm="cowrite"'})

    async def document_history(request: Request) -> list[dict[str, Any]] | Response:
        """The document's history for a caller allowed to read it, else the refusal."""
        document_id = request.path_params["document_id"]
        if not DOCUMENT_ID_RE.fullmatch(document_id):
            return _json({"error": "unknown document"}, 404)
        principal = bearer(request)
        if isinstance(principal, Response):
            return principal
        if not principal.may_open(document_id):
            return _json({"error": "this token does not grant the document"}, 403)
        try:
            return await services.backend.read_history(document_id)
        except BackendUnavailable:  # a retry, like the other endpoints' 503
            return Response(orjson.dumps({"error": "the shared backend is unavailable; retry "
                                          "shortly"}), status_code=503,
                            media_type="application/json", headers={"Retry-After": "1"})

    async def history(request: Request) -> Response:
        entries = await document_history(request)
        if isinstance(entries, Response):
            return entries
        thread = request.query_params.get("thread", DEFAULT_THREAD)
        if not THREAD_ID_RE.fullmatch(thread):
            return _json({"error": "thread must match [A-Za-z0-9._:-]{1,64}"}, 400)
        limit = request.query_params.get("limit", str(HISTORY_LIMIT_MAX))
        if not LIMIT_RE.fullmatch(limit) or not 1 <= int(limit) <= HISTORY_LIMIT_MAX:
            return _json({"error": f"limit must be an integer from 1 to {HISTORY_LIMIT_MAX}"},
                         400)
        messages = [entry for entry in entries if thread_of(entry) == thread]
        kept = messages[-int(limit):]  # the newest
        return _json({"document_id": request.path_params["document_id"], "thread_id": thread,
                      "messages": kept, "more": len(kept) < len(messages)})

    async def list_threads(request: Request) -> Response:
        entries = await document_history(request)
        if isinstance(entries, Response):
            return entries
        return _json({"document_id": request.path_params["document_id"],
                      "threads": threads(entries)})

    async def list_tools(request: Request) -> Response:
        denied = bearer(request)
        if isinstance(denied, Response):
            return denied
        return _json({"tools": tools.describe()})

    async def list_workflows(request: Request) -> Response:
        denied = bearer(request)
        if isinstance(denied, Response):
            return denied
        return _json({"workflows": [w.public() for w in tools.workflows()]})

    async def dev_token(request: Request) -> Response:
        if not settings.dev or not _is_loopback(request):
            return _json({"error": "not found"}, 404)
        if not _dev_request_is_local(request):
            return _json({"error": "forbidden: a loopback Host, a JSON body and no other "
                                   "site's Origin are required"}, 403)
        try:
            raw = await _small_body(request, DEV_TOKEN_BODY_MAX)
        except TimeoutError:
            return _json({"error": "request body not received within "
                                   f"{http_edge.BODY_TIMEOUT_S:g} s"}, 408)
        if raw is None:
            return _json({"error": f"request body larger than {DEV_TOKEN_BODY_MAX} bytes"}, 413)
        try:
            body = DevTokenRequest.model_validate_json(raw)
        except ValidationError as exc:
            return _json({"error": "invalid request", "details": exc.errors(include_url=False,
                          include_context=False, include_input=False)}, 422)
        token = services.auth.issue_dev_token(body.user, body.docs, body.role, body.ttl_s)
        return _json({"token": token})

    async def index(_: Request) -> Response:
        return FileResponse(STATIC_DIR / "index.html")

    # COWRITE_METRICS_PORT: /metrics lives on its own listener (a private network,
    # say), and the public port answers 404 for it.
    metrics_server: MetricsServer | None = None
    if settings.metrics_port is not None:
        metrics_app = Starlette(routes=[Route("/metrics", metrics)])
        metrics_server = MetricsServer(metrics_config(metrics_app, settings))

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        await services.backend.start()
        await services.router.start()
        metrics_task = None
        if metrics_server is not None:
            metrics_task = asyncio.create_task(metrics_server.serve(metrics_sockets or None))
            await metrics_server.wait_started(metrics_task)
        await tools.start()
        llm = services.runs.llm
        if isinstance(llm, Warmable) and settings.openai_warmup_timeout_s > 0:
            await llm.warm(settings.openai_warmup_timeout_s)  # no cold start for run one
        try:
            yield
        finally:
            if metrics_server is not None and metrics_task is not None:
                metrics_server.should_exit = True
                await metrics_task
            services.runs.draining = True  # no queued run starts on the way out
            for session in list(services.hub.sessions.values()):
                # A run that became active while the drain handed the others over (a
                # `run.start` on a connection still open, a takeover under way) goes to
                # the survivor too: it was ended `server_shutdown` while others lived.
                if services.router.handing_over:
                    await session.runs.hand_over()
                else:
                    await session.runs.shutdown()
            await chat_runs.close()
            await services.router.stop()
            await tools.close()
            await services.runs.llm.close()
            await services.backend.close()
            if tracing.active is not None:  # exported now: uvicorn ends a SIGTERM by
                await asyncio.to_thread(tracing.active.shutdown)  # the signal, no atexit

    routes = [
        Route("/", index),
        Route("/healthz", healthz),
        Route("/readyz", readyz),
        Route("/metrics", metrics if metrics_server is None else not_here),
        Route("/v1/protocol/schema", protocol_schema),
        Route("/v1/documents/{document_id:path}/history", history),
        Route("/v1/documents/{document_id:path}/threads", list_threads),
        Route("/v1/tools", list_tools),
        Route("/v1/workflows", list_workflows),
        Route("/v1/dev/token", dev_token, methods=["POST"]),
        Route("/v1/documents/{document_id}/runs/{run_id}/tool-results", post_tool_result,
              methods=["POST"]),
        Route("/v1/ai-sdk/{document_id}/chat", post_chat, methods=["POST"]),
        Route("/v1/ai-sdk/{document_id}/chat/{chat_id}/stream", get_chat_stream),
        WebSocketRoute("/v1/ai-sdk/{document_id}/ws", ai_sdk_socket),
        Route("/v1/agui/{document_id}", post_agui, methods=["POST"]),
        WebSocketRoute(DOCUMENT_SOCKET, document_socket),  # reached through DirectRoute
        Mount("/static", StaticFiles(directory=STATIC_DIR), name="static"),
    ]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={
        Exception: internal_error}, middleware=[
        Middleware(TransportHandle),
        Middleware(DirectRoute, path=DOCUMENT_SOCKET, endpoint=document_socket),
        # Inside DirectRoute: the document socket never passes through it. Browser
        # frontends on another origin (the AI SDK, AG-UI, tool results) authenticate
        # with a Bearer header, not cookies, so no credentials are allowed or needed.
        Middleware(CORSMiddleware, allow_origins=settings.allowed_origins or ["*"],
                   allow_methods=["GET", "POST"], allow_headers=["*"], max_age=600,
                   expose_headers=["retry-after", "x-vercel-ai-ui-message-stream"])])
    app.state.services = services
    app.state.tools = tools
    app.state.chat_runs = chat_runs
    app.state.handshakes = HandshakeGate(settings.max_pending_handshakes)
    # HTTP tool results hold no connection: the WebSocket's message rate, per user
    app.state.tool_result_buckets = UserBuckets(settings.rate_messages_per_s,
                                                settings.rate_messages_per_s * 2)
    return app
