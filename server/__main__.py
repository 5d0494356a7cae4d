"""`python -m server`: run one cowrite instance with settings from the environment."""

import sys

from server.app import create_app
from server.lifecycle import DrainingServer, drain
from server.runner import uvicorn_config
from server.settings import Settings
from server.tools.config import ConfigError


def main() -> int:
    settings = Settings()
    try:
        app = create_app(settings)
    except ConfigError as exc:  # one clear line, not a traceback
        print(f"cowrite: {exc}", file=sys.stderr, flush=True)
        return 2
    mode = "dev" if settings.dev else "production"
    backend = "redis" if settings.redis_url else "memory"
    print(
        f"cowrite ({mode}, {backend} backend, {settings.effective_llm} model) on "
        f"http://{settings.host}:{settings.port}/",
        file=sys.stderr,
        flush=True,
    )
    services = app.state.services
    server = DrainingServer(uvicorn_config(app, settings, log_level="info"),
                            on_shutdown=lambda: drain(services))
    server.run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
