"""Settings that cannot work stop the start in one line each, exit 2: out-of-range numbers
(COWRITE_PORT=99999 served on 34463, a zero hello timeout closed every connection 4001),
an allowed origin that is not one, a host that does not resolve, tracing without its
exporter. Allowed origins match the browser's `Origin` whatever their case or trailing
`/`, and a warm-up that the model server answers 404 or 401 says which variable is wrong."""

import asyncio
import contextlib
import logging
import os
import subprocess
import sys
from collections.abc import AsyncIterator

import httpx
import pytest
from pydantic import ValidationError
from websockets.exceptions import InvalidStatus

from server.agent.openai_chat import OpenAIChat
from server.settings import Settings, normalized_origin
from server.startup_errors import settings_problems
from tests.harness import free_port, joined, running_server, ws_client
from tests.log_records import records_of

API_KEY = "sk-proj-AbCdEf1234567890"


def start(*prelude: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`python -m server` with only `env`'s COWRITE_* variables; `prelude` runs first
    (to hide a module, as if its package were not installed)."""
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("COWRITE_", "OTEL_"))
            and k != "OPENAI_API_KEY"}
    code = "\n".join([*prelude, "import runpy", "runpy.run_module('server', "
                      "run_name='__main__', alter_sys=True)"])
    env = {"COWRITE_JWT_SECRET": "s" * 40, "COWRITE_PORT": str(free_port()), **env}
    return subprocess.run([sys.executable, "-c", code], env={**keep, **env},
                          capture_output=True, text=True, timeout=60)


def one_line_each(ended: subprocess.CompletedProcess[str], said: list[str]) -> None:
    lines = ended.stderr.strip().splitlines()
    assert ended.returncode == 2, ended.stderr
    assert "Traceback" not in ended.stderr
    assert len(lines) == len(said), lines
    for words in said:
        assert any(line.startswith("cowrite: ") and words in line for line in lines), \
            (words, lines)


def problems(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> list[str]:
    for name in list(os.environ):
        if name.startswith("COWRITE_"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    try:
        Settings()
    except ValidationError as exc:
        return list(settings_problems(exc))
    return []


# --- ranges ---------------------------------------------------------------------------

def test_out_of_range_settings_stop_the_start_one_line_each() -> None:
    ended = start(COWRITE_PORT="99999", COWRITE_METRICS_PORT="89537",
                  COWRITE_HELLO_TIMEOUT_S="0", COWRITE_HEARTBEAT_S="-5", COWRITE_MAX_STEPS="-1",
                  COWRITE_RATE_MESSAGES_PER_S="-1", COWRITE_RATE_RUNS_PER_MIN="-1",
                  COWRITE_CLOSE_TIMEOUT_S="-2",
                  COWRITE_ALLOWED_ORIGINS="https://app.example,https://app.example/editor")
    one_line_each(ended, [
        "COWRITE_PORT: Input should be less than or equal to 65535",
        "COWRITE_METRICS_PORT: Input should be less than or equal to 65535",
        "COWRITE_HELLO_TIMEOUT_S: Input should be greater than 0",
        "COWRITE_HEARTBEAT_S: Input should be greater than 0",
        "COWRITE_MAX_STEPS: Input should be greater than or equal to 1",
        "COWRITE_RATE_MESSAGES_PER_S: Input should be greater than or equal to 0",
        "COWRITE_RATE_RUNS_PER_MIN: Input should be greater than or equal to 0",
        "COWRITE_CLOSE_TIMEOUT_S: Input should be greater than 0",
        "COWRITE_ALLOWED_ORIGINS: entry 2 is not an origin",
    ])


@pytest.mark.parametrize(("name", "value", "said"), [
    ("COWRITE_PORT", "-1", "greater than or equal to 0"),
    ("COWRITE_PORT", "65536", "less than or equal to 65535"),
    ("COWRITE_METRICS_PORT", "0", "greater than or equal to 1"),
    ("COWRITE_HEARTBEAT_S", "0", "greater than 0"),
    ("COWRITE_HELLO_TIMEOUT_S", "-1", "greater than 0"),
    ("COWRITE_CLOSE_TIMEOUT_S", "0", "greater than 0"),
    ("COWRITE_CLOSE_TIMEOUT_S", "nan", "finite number"),
    ("COWRITE_TOOL_TIMEOUT_S", "inf", "finite number"),
    ("COWRITE_TOOL_TIMEOUT_S", "1e17", "less than or equal to 31536000"),
    ("COWRITE_APPROVAL_TIMEOUT_S", "1e308", "less than or equal to 31536000"),
    ("COWRITE_CLIENT_GRACE_S", "31536001", "less than or equal to 31536000"),
    ("COWRITE_RUN_TIMEOUT_S", "0", "greater than 0"),
    ("COWRITE_APPROVAL_TIMEOUT_S", "-1", "greater than 0"),
    ("COWRITE_SERVER_TOOL_TIMEOUT_S", "0", "greater than 0"),
    ("COWRITE_RUN_LEASE_S", "0", "greater than 0"),
    ("COWRITE_JANITOR_INTERVAL_S", "0", "greater than 0"),
    ("COWRITE_CLIENT_GRACE_S", "-1", "greater than or equal to 0"),
    ("COWRITE_MAX_STEPS", "0", "greater than or equal to 1"),
    ("COWRITE_MAX_STEPS", "100000000000000000000", "less than or equal to 1000000"),
    ("COWRITE_LOG_MAX_EVENTS", "0", "greater than or equal to 1"),
    ("COWRITE_MAX_CONNECTIONS_PER_USER", "-1", "greater than or equal to 0"),
    ("COWRITE_MAX_INVALID_MESSAGES", "-1", "greater than or equal to 0"),
    ("COWRITE_MAX_PENDING_HANDSHAKES", "-1", "greater than or equal to 0"),
    ("COWRITE_MEMORY_IDLE_S", "-1", "greater than or equal to 0"),
    ("COWRITE_MEMORY_MAX_DOCUMENTS", "-1", "greater than or equal to 0"),
    ("COWRITE_RATE_MESSAGES_PER_S", "-0.5", "greater than or equal to 0"),
])
def test_each_range_is_checked_and_names_its_variable(
        name: str, value: str, said: str, monkeypatch: pytest.MonkeyPatch) -> None:
    found = problems({name: value}, monkeypatch)
    assert len(found) == 1 and found[0].startswith(f"{name}: ") and said in found[0], found


def test_mcp_retry_delays_must_be_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """A first delay longer than the longest one has no sensible reading: refused."""
    found = problems({"COWRITE_MCP_RETRY_MIN_S": "60"}, monkeypatch)
    assert len(found) == 1 and "COWRITE_MCP_RETRY_MIN_S must not exceed" in found[0], found


@pytest.mark.parametrize("value", ["", "   "])
def test_an_empty_model_name_stops_the_start(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """`COWRITE_MODEL=` started, and every run then failed at the upstream."""
    found = problems({"COWRITE_MODEL": value}, monkeypatch)
    assert len(found) == 1 and found[0].startswith("COWRITE_MODEL is empty"), found


def test_zero_keeps_its_documented_meaning(monkeypatch: pytest.MonkeyPatch) -> None:
    """README's table gives these a meaning at 0 (OS-picked port, no cap, disabled,
    never, none): they stay accepted."""
    zeros = ["PORT", "MAX_JSON_DEPTH", "MAX_PENDING_HANDSHAKES", "MAX_INVALID_MESSAGES",
             "MEMORY_IDLE_S", "MEMORY_MAX_DOCUMENTS", "MAX_CONNECTIONS_PER_USER",
             "RATE_MESSAGES_PER_S", "RATE_RUNS_PER_MIN", "HISTORY_MAX_CHARS",
             "OPENAI_WARMUP_TIMEOUT_S", "MAX_QUEUED_RUNS"]
    assert problems({f"COWRITE_{name}": "0" for name in zeros}, monkeypatch) == []


def test_an_empty_config_path_is_no_tool_file(monkeypatch: pytest.MonkeyPatch) -> None:
    """`COWRITE_CONFIG=` was the path `.`: "cannot read it (Is a directory)"."""
    assert problems({"COWRITE_CONFIG": ""}, monkeypatch) == []
    assert Settings().config is None
    monkeypatch.setenv("COWRITE_CONFIG", "  ")
    assert Settings().config is None


def test_a_host_that_does_not_resolve_is_one_line() -> None:
    ended = start(COWRITE_HOST="no-such-host.invalid")
    one_line_each(ended, ["COWRITE_HOST: not an IP address nor a name this machine resolves"])
    assert "no-such-host" not in ended.stderr


# --- tracing without its packages -----------------------------------------------------

@pytest.mark.parametrize(("hidden", "env", "said"), [
    ("opentelemetry.exporter.otlp.proto.http.trace_exporter", {},
     "COWRITE_OTEL_EXPORTER=otlp (the default) needs the OTLP exporter: pip install "
     "'cowrite[otel]'"),
    ("opentelemetry.sdk.trace", {"COWRITE_OTEL_EXPORTER": "console"},
     "COWRITE_OTEL=1 needs the otel extra: pip install 'cowrite[otel]'"),
], ids=["no-otlp-exporter", "no-sdk"])
def test_tracing_without_its_package_is_one_line(hidden: str, env: dict[str, str],
                                                  said: str) -> None:
    ended = start("import sys", f"sys.modules[{hidden!r}] = None  # as if not installed",
                  COWRITE_OTEL="1", **env)
    one_line_each(ended, [said])


# --- allowed origins ------------------------------------------------------------------

@pytest.mark.parametrize(("entry", "origin"), [
    ("http://localhost:3000/", "http://localhost:3000"),
    ("HTTP://Example.COM", "http://example.com"),
    (" https://app.example:443/ ", "https://app.example"),
    ("http://app.example:80", "http://app.example"),
    ("https://app.example:8443", "https://app.example:8443"),
    ("http://[::1]:5173/", "http://[::1]:5173"),
    ("http://bücher.example", "http://xn--bcher-kva.example"),
    # as Chromium sends them (UTS #46 non-transitional; canonical IP addresses): these
    # entries never matched a real browser's Origin
    ("https://straße.de", "https://xn--strae-oqa.de"),
    ("https://faß.example", "https://xn--fa-hia.example"),
    ("http://[0:0:0:0:0:0:0:1]:4000", "http://[::1]:4000"),
    ("http://127.1:3000", "http://127.0.0.1:3000"),
    ("http://[::ffff:127.0.0.1]", "http://[::ffff:7f00:1]"),
    ("app.example", None), ("localhost:3000", None), ("*", None), ("null", None),
    ("https://app.example/editor", None), ("https://app.example/?a=1", None),
    ("https://app.example#top", None), ("https://user:pw@app.example", None),
    ("https://app.example:99999", None), ("https://", None),
])
def test_an_origin_is_normalised_as_a_browser_sends_it(entry: str, origin: str | None) -> None:
    assert normalized_origin(entry) == origin


def test_an_entry_that_is_no_origin_is_named_by_its_place(
        monkeypatch: pytest.MonkeyPatch) -> None:
    found = problems({"COWRITE_ALLOWED_ORIGINS": "https://ok.example, *"}, monkeypatch)
    assert len(found) == 1 and found[0].startswith(
        "COWRITE_ALLOWED_ORIGINS: entry 2 is not an origin"), found
    assert "*" not in found[0].split(":", 1)[1].split("(")[0]


async def test_origins_match_whatever_their_case_or_trailing_slash() -> None:
    allowed = "http://localhost:3000/, HTTP://App.Example:8443"
    async with running_server(allowed_origins=allowed, port=free_port()) as srv:
        for origin in ("http://localhost:3000", "http://app.example:8443",
                       "HTTP://APP.example:8443"):  # browsers send lower case; others may not
            async with joined(srv, origin=origin):
                pass
        for refused in ("http://localhost:3001", "https://localhost:3000", "http://evil.example"):
            with pytest.raises(InvalidStatus) as info:
                async with ws_client(srv.ws_url(), origin=refused):
                    pass
            assert info.value.response.status_code == 403
        # The AI SDK socket checks the same list.
        url = f"ws://127.0.0.1:{srv.settings.port}/v1/ai-sdk/doc-1/ws"
        async with ws_client(url, origin="http://localhost:3000"):
            pass
        with pytest.raises(InvalidStatus) as info:
            async with ws_client(url, origin="http://evil.example"):
                pass
        assert info.value.response.status_code == 403


async def test_http_adapters_answer_cross_origin_requests() -> None:
    """A frontend on another origin (a Next.js app on :3000 using the AI SDK or AG-UI)
    got 405 to its preflight: without a same-origin proxy it could not call cowrite."""
    async with running_server(allowed_origins="http://localhost:3000") as srv, \
            httpx.AsyncClient() as http:
        url = f"http://127.0.0.1:{srv.settings.port}/v1/ai-sdk/doc-1/chat"
        asked = {"access-control-request-method": "POST",
                 "access-control-request-headers": "authorization, content-type"}
        preflight = await http.options(url, headers={"origin": "http://localhost:3000",
                                                     **asked})
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == "http://localhost:3000"
        assert "authorization" in preflight.headers["access-control-allow-headers"].lower()
        elsewhere = await http.options(url, headers={"origin": "http://evil.example", **asked})
        assert "access-control-allow-origin" not in elsewhere.headers
        answered = await http.post(url, json={}, headers={"origin": "http://localhost:3000"})
        assert answered.status_code == 401  # no token: refused, but readable by the page
        assert answered.headers["access-control-allow-origin"] == "http://localhost:3000"
    async with running_server() as srv, httpx.AsyncClient() as http:  # no list: any origin
        tools = await http.get(f"http://127.0.0.1:{srv.settings.port}/v1/tools",
                               headers={"origin": "https://app.example"})
        assert tools.headers["access-control-allow-origin"] == "*"


# --- the model server's answer to the warm-up -----------------------------------------

@contextlib.asynccontextmanager
async def answering(status: int) -> AsyncIterator[int]:
    """A loopback HTTP server that answers every request `status` with an OpenAI-style
    error body; yields its port."""
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            await reader.readuntil(b"\r\n\r\n")
            body = b'{"error": {"message": "no", "type": "invalid_request_error"}}'
            writer.write(b"HTTP/1.1 %d Error\r\ncontent-type: application/json\r\n"
                         b"content-length: %d\r\nconnection: close\r\n\r\n%s"
                         % (status, len(body), body))
            await writer.drain()
        writer.close()

    port = free_port()
    server = await asyncio.start_server(answer, "127.0.0.1", port)
    try:
        yield port
    finally:
        server.close()
        await server.wait_closed()


def agent_log() -> contextlib.AbstractContextManager[list[logging.LogRecord]]:
    """Records of `cowrite.agent` (the app's logging setup stops them reaching caplog)."""
    return records_of("cowrite.agent")


@pytest.mark.parametrize(("status", "path", "said"), [
    (404, "", "check COWRITE_OPENAI_BASE_URL; OpenAI-compatible servers usually serve "
              "under /v1: add /v1 to its end"),
    (404, "/v1", "check COWRITE_OPENAI_BASE_URL"),
    (401, "/v1", "refused the API key (401) while warming up: check OPENAI_API_KEY"),
    (403, "/v1", "refused the API key (403) while warming up: check OPENAI_API_KEY"),
], ids=["404-no-v1", "404", "401", "403"])
async def test_a_warm_up_answered_with_an_error_names_the_variable(
        status: int, path: str, said: str) -> None:
    async with answering(status) as port:
        chat = OpenAIChat(API_KEY, f"http://127.0.0.1:{port}{path}")
        try:
            with agent_log() as records:
                await chat.warm(5.0)
        finally:
            await chat.close()
    warnings = [r.getMessage() for r in records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and said in warnings[0], [r.getMessage() for r in records]
    assert path == "" or "add /v1" not in warnings[0]
    assert not any("not reached" in r.getMessage() for r in records)
    assert all(API_KEY[:10] not in r.getMessage() and str(port) not in r.getMessage()
               for r in records)
