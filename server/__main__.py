"""`python -m server`: run one cowrite instance with settings from the environment.

It prints one line once the socket is bound: the URL it really serves (the
bound port, so `COWRITE_PORT=0` shows the port the OS picked; a wildcard host
shows a loopback URL a browser can open). uvicorn's own start-up chatter is
left at warning level so `make run` shows a newcomer nothing else; errors
(a port in use, say) still print.
"""

import gc
import ipaddress
import socket
import sys
from collections.abc import Awaitable, Callable, Sequence

import uvicorn
from pydantic import ValidationError

from server.app import create_app
from server.lifecycle import DrainingServer, drain
from server.runner import bind_listeners, bind_metrics, close_all, uvicorn_config
from server.settings import Settings
from server.startup_errors import StartupError, settings_problems
from server.tools.config import ConfigError


def browser_url(configured_host: str, bound: tuple[object, ...]) -> str:
    """The URL to open for a server listening on `bound` (a getsockname() tuple).

    A wildcard host (0.0.0.0, ::) is not an address a browser can open, so it
    becomes the loopback address of the same family; IPv6 gets brackets.
    """
    port = int(str(bound[1]))
    host = configured_host or "0.0.0.0"  # empty: every interface (it printed http://:8000/)
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None  # a name such as "localhost": keep it
    if address is not None and address.is_unspecified:
        host = "::1" if address.version == 6 else "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/"


def check_host(host: str) -> None:
    """A `COWRITE_HOST` that does not resolve stops the start in one line, exit 2 (it
    was uvicorn's `[Errno -2] Name or service not known`, exit 3, after the lifespan).
    An empty host means every interface."""
    if not host:
        return
    try:
        socket.getaddrinfo(host, None, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not a valid name"
        raise StartupError(f"COWRITE_HOST: not an IP address nor a name this machine "
                           f"resolves ({reason})") from exc


GC_THRESHOLDS = (5_000, 4, 50)


def settle_heap() -> None:
    """Once started, keep the garbage collector off the loop's critical path.

    What start-up built (modules, classes, pydantic schemas: ~150,000
    objects) lives as long as the process, yet every full collection walked
    it again: pauses of 100-300 ms with 1,000 busy connections, which every
    connection's events waited out. `gc.freeze()` moves it out of the
    collector's sight. The thresholds trade pause length for frequency
    (`python -m bench.load`, 1,000 runs, quiet machine, longest pause seen):
    Python's (700, 10, 10) spent ~25% of the server's CPU collecting, with
    full collections of 100-340 ms; (10,000, 10, 10) ~6%, but each
    second-generation collection walked up to 100,000 objects (50-55 ms);
    (5,000, 4, 50) the same ~6% with second-generation pauses of 11-14 ms
    and no full collection during the run. Cyclic garbage still goes, a
    little later.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


class AnnouncingServer(DrainingServer):
    """DrainingServer that prints the URL it serves once its socket is bound."""

    def __init__(self, settings: Settings, config: uvicorn.Config,
                 on_shutdown: Callable[[], Awaitable[None]],
                 backend_ready: Callable[[], Awaitable[bool]] | None = None) -> None:
        super().__init__(config, on_shutdown)
        self._settings = settings
        self._backend_ready = backend_ready

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)  # the lifespan (imports, warm-ups) ran first
        if not self.started or not self.servers:
            return
        settle_heap()
        listeners: Sequence[socket.socket] = self.servers[0].sockets
        if not listeners:
            return
        settings = self._settings
        mode = "dev" if settings.dev else "production"
        backend = "redis" if settings.redis_url else "memory"
        wildcard = " (all interfaces)" if settings.host in ("0.0.0.0", "::", "") else ""
        # A wrong COWRITE_REDIS_URL looked like a brief outage under a "serving" banner.
        unready = "" if self._backend_ready is None or await self._backend_ready() else (
            "; Redis does not answer (check COWRITE_REDIS_URL): /readyz says 503 until it does")
        print(
            f"cowrite ({mode}, {backend} backend, {settings.effective_llm} model) serving "
            f"{browser_url(settings.host, listeners[0].getsockname())}{wildcard}{unready}",
            file=sys.stderr,
            flush=True,
        )


def main() -> int:
    metrics_sockets: list[socket.socket] = []
    listeners: list[socket.socket] = []
    try:
        settings = Settings()
        check_host(settings.host)
        # A port in use: one line, exit 2, before anything starts.
        listeners = bind_listeners(settings.host, settings.port, "COWRITE_PORT")
        metrics_sockets = bind_metrics(settings)
        app = create_app(settings, metrics_sockets=metrics_sockets)
    except ValidationError as exc:  # a bad COWRITE_* value: one line each, no values
        for problem in settings_problems(exc):
            print(f"cowrite: {problem}", file=sys.stderr, flush=True)
        return 2
    except (StartupError, ConfigError, ValueError) as exc:  # the checks' own words, one line
        close_all(listeners + metrics_sockets)
        print(f"cowrite: {exc}", file=sys.stderr, flush=True)
        return 2
    services = app.state.services
    server = AnnouncingServer(settings, uvicorn_config(app, settings, log_level="warning"),
                              on_shutdown=lambda: drain(services),
                              backend_ready=services.backend.ready)
    try:
        server.run(sockets=listeners)
    except KeyboardInterrupt:
        # uvicorn shut down cleanly, then re-raised the Ctrl-C it captured: no traceback.
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
