"""One settings object, read from `COWRITE_*` environment variables.

Nothing reads `os.environ` at import time: `create_app(settings)` receives a
`Settings` instance, so tests build their own and two apps can live in one
process. Every field here is listed in README's configuration table.
"""

import contextlib
import ipaddress
import socket
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

import idna
from pydantic import AliasChoices, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

# Ranges of the settings (README's table says which take 0 and what it means). A float
# that is not finite (`inf`, `nan`) is refused too: `int(inf * 1000)` raised mid-run; so
# is a duration over a year: 1e17 s passed the start and then failed every tool call
# (its deadline in ms no longer fits the 64 bits the wire and the checkpoint carry).
MAX_SECONDS = 31_536_000.0
Port = Annotated[int, Field(ge=0, le=65535)]  # 0: the OS picks one (the banner says which)
Seconds = Annotated[float, Field(gt=0, le=MAX_SECONDS, allow_inf_nan=False)]  # 0: no sense
SecondsOrOff = Annotated[float, Field(ge=0, le=MAX_SECONDS, allow_inf_nan=False)]  # 0: off
RateOrOff = Annotated[float, Field(ge=0, allow_inf_nan=False)]  # 0: disabled
Count = Annotated[int, Field(ge=1)]
CountOrOff = Annotated[int, Field(ge=0)]  # 0: documented meaning (disables, no cap, none)

_DEFAULT_PORTS = {"http": 80, "https": 443}


def _canonical_host(host: str) -> str | None:
    """`host` as a browser serialises it: an IP address canonical (`[::1]`, not
    `[0:0:0:0:0:0:0:1]`; `127.0.0.1`, not `127.1`), a name in its ASCII form by
    UTS #46 without transitional mapping (`straße.de` is `xn--strae-oqa.de`, not
    Python's IDNA 2003 `strasse.de`, which no browser sends)."""
    with contextlib.suppress(ValueError):
        address = ipaddress.ip_address(host)
        return f"[{address.compressed}]" if address.version == 6 else str(address)
    if host and all(c in "0123456789abcdefx." for c in host) and host[0].isdigit():
        with contextlib.suppress(OSError):  # IPv4 shorthand, octal, hex (as WHATWG parses)
            return str(ipaddress.IPv4Address(socket.inet_aton(host)))
    if host.isascii():
        return host
    try:
        return str(idna.encode(host, uts46=True, transitional=False).decode("ascii"))
    except idna.IDNAError:
        return None


def normalized_origin(value: str) -> str | None:
    """`value` as a browser writes an `Origin` header (`scheme://host[:port]`, scheme
    and host in lower case, no default port, no trailing `/`), or None when it is not
    one (no scheme or host, a path, a query, a fragment, credentials, a bad port)."""
    try:
        parts = urlsplit(value.strip())
        port = parts.port
    except ValueError:  # a port that is not a number or out of range, a bad IPv6 literal
        return None
    scheme, host = parts.scheme.lower(), parts.hostname
    if not scheme or not host or parts.path not in ("", "/") or parts.query \
            or parts.fragment or "?" in value or "#" in value or parts.username is not None:
        return None
    host = _canonical_host(host)
    if host is None:
        return None
    if port is not None and port != _DEFAULT_PORTS.get(scheme):
        return f"{scheme}://{host}:{port}"
    return f"{scheme}://{host}"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="COWRITE_", extra="ignore", frozen=True)

    # Serving
    host: str = "127.0.0.1"
    port: Port = 8000
    dev: bool = False
    log_json: bool | None = None  # default: JSON unless dev
    log_level: str = "info"

    # Authentication (section 2)
    jwt_secret: SecretStr | None = None
    jwt_public_key: str | None = None
    jwt_audience: str | None = None
    call_token_secret: SecretStr | None = None
    allowed_origins: Annotated[list[str], NoDecode] = Field(default_factory=list)
    metrics_token: SecretStr | None = None  # Bearer token /metrics asks for, when set
    # serve /metrics on this port only (not the main one); 0 would hide it on a port
    # nobody is told
    metrics_port: Annotated[int, Field(ge=1, le=65535)] | None = None

    # Transport (sections 1 and 7)
    max_message_bytes: int = 1_048_576
    heartbeat_s: Seconds = 20.0
    hello_timeout_s: Seconds = 5.0
    outbound_queue_max: int = 4096
    outbound_max_bytes: int = 1_048_576  # queued frame text per connection, then 4009
    max_json_depth: int = 64  # 0: only orjson's own limit (1024)
    max_pending_handshakes: CountOrOff = 256  # sockets not yet past hello, per instance; 0: no cap
    max_invalid_messages: CountOrOff = 20  # 0: no limit
    close_timeout_s: Seconds = 2.0

    # Document logs and backend (section 3)
    redis_url: str | None = None
    log_max_events: Count = 10_000
    memory_idle_s: SecondsOrOff = 3600.0  # memory backend: evict documents idle this long; 0: never
    memory_max_documents: CountOrOff = 10_000  # memory backend: LRU cap on documents held; 0: none

    # Limits (section 6a); 0 disables
    max_connections_per_user: CountOrOff = 50
    rate_messages_per_s: RateOrOff = 200.0
    rate_runs_per_min: CountOrOff = 120

    # Tracing (optional extra `otel`): a span per run, children per model call,
    # tool round trip and approval wait
    otel: bool = False
    otel_exporter: Literal["otlp", "console", "none"] = "otlp"
    otel_capture_text: bool = False  # put the prompt on the run span

    # Agent runs (section 6)
    llm: Literal["scripted", "openai"] | None = None
    model: str = "gpt-4o-mini"
    allowed_models: Annotated[list[str], NoDecode] = Field(default_factory=list)
    openai_api_key: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("OPENAI_API_KEY", "COWRITE_OPENAI_API_KEY")
    )
    openai_base_url: str | None = None
    openai_warmup_timeout_s: SecondsOrOff = 3.0  # 0: no warm-up at start
    openai_timeout_s: Seconds = 120.0  # one model request, any silence
    history_max_chars: CountOrOff = 24_000  # earlier turns sent to the model
    tool_format: Literal["native", "json"] = "native"
    system_prompt: str = (
        "You are cowrite, an assistant that co-writes a document with its authors. "
        "Use the tools to read and edit the document; keep edits minimal and explain them briefly."
    )
    # bounded: a run's checkpoint holds it, and one beyond 64 bits could not be encoded
    max_steps: Annotated[int, Field(ge=1, le=1_000_000)] = 20
    tool_timeout_s: Seconds = 60.0
    approval_timeout_s: Seconds = 300.0
    run_timeout_s: Seconds = 600.0
    client_grace_s: SecondsOrOff = 30.0  # 0: a run waiting on a gone executor ends at once
    server_tool_timeout_s: Seconds = 10.0
    run_lease_s: Seconds = 10.0
    # Redis: how often an instance looks for runs to take over and stalled queues (a
    # quarter lease when that is shorter): a run is taken over within lease + this
    janitor_interval_s: Seconds = 0.5
    # Redis: checkpoint runs so a survivor takes them over (section 13); False is 1.0's
    # behaviour (a lost owner's run ends server_lost), to measure what checkpoints cost
    durable_runs: bool = True
    max_queued_runs: CountOrOff = 8
    allow_interrupt: bool = True

    # Server tools and MCP servers (section 15)
    config: Path | None = None
    mcp_connect_timeout_s: Seconds = 10.0
    mcp_retry_min_s: Seconds = 0.5
    mcp_retry_max_s: Seconds = 30.0
    mcp_poll_s: Seconds = 30.0

    @field_validator("allowed_origins", "allowed_models", mode="before")
    @classmethod
    def _split_origins(cls, value: object) -> object:
        if isinstance(value, str):
            return [item.strip() for item in value.split(",") if item.strip()]
        return value

    @field_validator("allowed_origins")
    @classmethod
    def _normalize_origins(cls, value: list[str]) -> list[str]:
        """Each entry as the browser sends its `Origin`: `http://localhost:3000/` or
        `HTTP://Example.com` refused every real request with 403. An entry that is
        not an origin stops the start (it could never match); named by its place,
        not its value."""
        origins = []
        for place, entry in enumerate(value, start=1):
            origin = normalized_origin(entry)
            if origin is None:
                raise ValueError(
                    f"entry {place} is not an origin: write scheme://host[:port] with no "
                    "path, query or credentials (e.g. https://app.example.com), or leave "
                    "the variable unset to allow any origin")
            origins.append(origin)
        return origins

    @field_validator("config", "jwt_secret", "jwt_public_key", "jwt_audience",
                     "call_token_secret", "redis_url", "openai_api_key", "openai_base_url",
                     mode="before")
    @classmethod
    def _empty_config_is_unset(cls, value: object) -> object:
        """An optional setting left empty or blank (`COWRITE_CONFIG=`, as a template or a
        shell leaves it) is unset: `COWRITE_CONFIG=` was read as the path `.`, a
        directory; `COWRITE_JWT_AUDIENCE=` refused every token for lacking an `aud`;
        `COWRITE_JWT_PUBLIC_KEY=` skipped the check that instances sharing Redis share a
        call-token key; `COWRITE_REDIS_URL=` announced durable runs on the memory
        backend. (`COWRITE_METRICS_TOKEN=` stays an error: it would open /metrics.)"""
        if isinstance(value, str) and not value.strip():
            return None
        return value

    def origin_allowed(self, origin: str) -> bool:
        """Whether a request's `Origin` header passes `COWRITE_ALLOWED_ORIGINS` (no
        entries: any origin passes). Compared in the normalised form both sides."""
        allowed = self.allowed_origins
        return not allowed or origin in allowed or normalized_origin(origin) in allowed

    @model_validator(mode="after")
    def _check(self) -> "Settings":
        if self.max_message_bytes < 1024:
            raise ValueError("COWRITE_MAX_MESSAGE_BYTES must be at least 1024")
        if self.outbound_queue_max < 16:
            raise ValueError("COWRITE_OUTBOUND_QUEUE_MAX must be at least 16")
        if self.outbound_max_bytes < 16_384:
            raise ValueError("COWRITE_OUTBOUND_MAX_BYTES must be at least 16384")
        if self.mcp_retry_min_s > self.mcp_retry_max_s:
            raise ValueError("COWRITE_MCP_RETRY_MIN_S must not exceed COWRITE_MCP_RETRY_MAX_S")
        if self.max_json_depth < 0:
            raise ValueError("COWRITE_MAX_JSON_DEPTH must be 0 (orjson's limit) or more")
        if self.metrics_port is not None and self.metrics_port == self.port:
            raise ValueError("COWRITE_METRICS_PORT must differ from COWRITE_PORT")
        if self.metrics_token is not None and not self.metrics_token.get_secret_value().strip():
            raise ValueError("COWRITE_METRICS_TOKEN is empty: give a token, or unset it to "
                             "serve /metrics without one")  # empty left /metrics open
        if not self.model.strip():  # every run's model request then failed upstream
            raise ValueError("COWRITE_MODEL is empty: give the model name the OpenAI-compatible "
                             "server serves, or unset it for the default")
        if self.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
            raise ValueError("COWRITE_LOG_LEVEL must be one of debug, info, warning, error, "
                             "critical")
        return self

    @property
    def effective_llm(self) -> Literal["scripted", "openai"]:
        """`scripted` unless asked for, or an OpenAI key is configured."""
        if self.llm is not None:
            return self.llm
        return "openai" if self.openai_api_key else "scripted"

    @property
    def json_logs(self) -> bool:
        return (not self.dev) if self.log_json is None else self.log_json
