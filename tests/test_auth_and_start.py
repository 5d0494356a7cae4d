"""Public keys verify their own algorithm only, empty optional settings are unset, start
errors are one line naming the variable, and every Bearer 401 carries its challenge.

A token whose header named the other key type's algorithm (`{"alg":"ES256"}` with an RSA
key) made PyJWT raise a TypeError: a 500 with a traceback on every HTTP route and a
dropped document socket (1006, no error frame). `COWRITE_JWT_AUDIENCE=` refused every
token, `COWRITE_JWT_PUBLIC_KEY=` skipped a start check. A busy `COWRITE_METRICS_PORT`
was an 81-line traceback, exit 3; a busy `COWRITE_PORT` uvicorn's own line, exit 3."""

import os
import socket
import subprocess
import sys
import time
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from pydantic import ValidationError

from server.auth import Authenticator, AuthError
from server.settings import Settings
from server.startup_errors import settings_problems
from tests.harness import SECRET, free_port, running_server, token, ws_client

CHALLENGE = 'Bearer realm="cowrite"'


def pem(private_key: Any) -> str:
    return str(private_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode())


def launch(**env: str) -> tuple[int | None, list[str]]:
    """`python -m server` with only `env`'s COWRITE_* variables: its exit code and its
    stderr lines, or None once it announced it serves (then it is stopped)."""
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("COWRITE_", "OTEL_"))
            and k != "OPENAI_API_KEY"}
    env = {"COWRITE_PORT": str(free_port()), "COWRITE_LOG_LEVEL": "warning", **env}
    with subprocess.Popen([sys.executable, "-m", "server"], env={**keep, **env},
                          stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                          text=True) as server:
        assert server.stderr is not None
        lines = []
        for line in server.stderr:
            lines.append(line.rstrip("\n"))
            if "serving" in line:
                server.terminate()
                server.communicate(timeout=30)
                return None, lines
        return server.wait(timeout=30), lines


def one_line(ended: tuple[int | None, list[str]], words: str) -> str:
    code, lines = ended
    assert code == 2, lines
    assert len(lines) == 1 and lines[0].startswith("cowrite: ") and words in lines[0], lines
    return lines[0]


# --- a public key verifies its own algorithm ----------------------------------------------

def forged(algorithm: str) -> str:
    """Only a header naming `algorithm`: no key needed to make one."""
    header = jwt.utils.base64url_encode(f'{{"alg":"{algorithm}"}}'.encode()).decode()
    return f"{header}.e30.AAAA"


@pytest.mark.parametrize("key_type", ["rsa", "ec"])
async def test_a_token_naming_the_other_key_types_algorithm_is_a_401(key_type: str) -> None:
    key: Any = (rsa.generate_private_key(public_exponent=65537, key_size=2048)
                if key_type == "rsa" else ec.generate_private_key(ec.SECP256R1()))
    other: Any = (ec.generate_private_key(ec.SECP256R1()) if key_type == "rsa"
                  else rsa.generate_private_key(public_exponent=65537, key_size=2048))
    own, foreign = ("RS256", "ES256") if key_type == "rsa" else ("ES256", "RS256")
    claims = {"sub": "dana", "docs": ["*"], "exp": int(time.time()) + 60}
    bad = [forged(foreign), jwt.encode(claims, other, algorithm=foreign)]
    async with running_server(jwt_public_key=pem(key), jwt_secret=None,
                              call_token_secret="c" * 40) as srv, \
            httpx.AsyncClient(base_url=srv.http) as http:
        for bad_token in bad:
            auth = {"authorization": f"Bearer {bad_token}"}
            for method, path in [("GET", "/v1/tools"), ("GET", "/v1/documents/d/history"),
                                 ("POST", "/v1/agui/d")]:
                answer = await http.request(method, path, headers=auth, json={})
                assert answer.status_code == 401, (path, answer.text)
                assert answer.headers["www-authenticate"] == CHALLENGE
                assert "algorithm" in answer.text and "internal" not in answer.text
            async with ws_client(srv.ws_url()) as client:
                await client.send({"type": "hello", "protocol": 1, "client_id": "t",
                                   "token": bad_token})
                assert await client.expect_close() == 4001
                assert [e["code"] for e in client.events] == ["invalid_token"]
        good = jwt.encode(claims, key, algorithm=own)  # the key's own still passes
        answer = await http.get("/v1/tools", headers={"authorization": f"Bearer {good}"})
        assert answer.status_code == 200


def test_pyjwt_failing_outside_its_errors_is_an_auth_error() -> None:
    """The safety net: were both algorithms allowed again (as they were), PyJWT's
    TypeError for the other family is a refused token, not a 500."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    auth = Authenticator(Settings(jwt_public_key=pem(key), call_token_secret="c" * 40))
    auth._algorithms = ["RS256", "ES256"]
    with pytest.raises(AuthError, match="invalid token"):
        auth.verify(forged("ES256"))


@pytest.mark.parametrize("key_type", ["ed25519", "p384"])
def test_a_key_of_another_type_or_curve_stops_the_start(key_type: str) -> None:
    key: Any = (ed25519.Ed25519PrivateKey.generate() if key_type == "ed25519"
                else ec.generate_private_key(ec.SECP384R1()))
    line = one_line(launch(COWRITE_JWT_PUBLIC_KEY=pem(key), COWRITE_CALL_TOKEN_SECRET="c" * 40),
                    "COWRITE_JWT_PUBLIC_KEY must be an RSA key (RS256) or an EC P-256 key")
    assert "BEGIN PUBLIC KEY" not in line


# --- empty optional settings are unset ------------------------------------------------------

@pytest.mark.parametrize("name", [
    "COWRITE_JWT_SECRET", "COWRITE_JWT_PUBLIC_KEY", "COWRITE_JWT_AUDIENCE",
    "COWRITE_CALL_TOKEN_SECRET", "COWRITE_REDIS_URL", "COWRITE_OPENAI_BASE_URL",
    "OPENAI_API_KEY"])
@pytest.mark.parametrize("value", ["", "  "])
def test_an_empty_optional_setting_is_unset(name: str, value: str,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in list(os.environ):
        if variable.startswith("COWRITE_") or variable == "OPENAI_API_KEY":
            monkeypatch.delenv(variable)
    monkeypatch.setenv(name, value)
    field = "openai_api_key" if name == "OPENAI_API_KEY" else name.removeprefix("COWRITE_").lower()
    assert getattr(Settings(), field) is None
    monkeypatch.setenv("COWRITE_METRICS_TOKEN", value)  # except this one: it opened /metrics
    with pytest.raises(ValidationError) as refused:
        Settings()
    assert any("COWRITE_METRICS_TOKEN is empty" in line
               for line in settings_problems(refused.value))


async def test_an_empty_audience_accepts_tokens_without_aud() -> None:
    async with running_server(jwt_audience="") as srv, \
            httpx.AsyncClient(base_url=srv.http) as http:
        answer = await http.get("/v1/tools", headers={"authorization": f"Bearer {token()}"})
        assert answer.status_code == 200, answer.text
        async with ws_client(srv.ws_url()) as client:
            await client.send({"type": "hello", "protocol": 1, "client_id": "t",
                               "token": token()})
            assert (await client.recv())["type"] == "welcome"


async def test_an_empty_redis_url_is_the_memory_backend_without_durable_runs() -> None:
    async with running_server(redis_url=" ") as srv, ws_client(srv.ws_url()) as client:
        await client.send({"type": "hello", "protocol": 1, "client_id": "t", "token": token()})
        welcome = await client.recv()
        assert welcome["type"] == "welcome" and "durable_runs" not in welcome["features"]


def test_an_empty_public_key_with_redis_still_needs_a_shared_call_key() -> None:
    one_line(launch(COWRITE_DEV="1", COWRITE_JWT_PUBLIC_KEY="",
                    COWRITE_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0"),
             "with COWRITE_REDIS_URL every instance must sign call tokens with the same key")


# --- start errors: one line naming the variable --------------------------------------------

def busy_port_start(variable: str) -> None:
    """`python -m server` with `variable` naming a port another socket listens on: one
    line naming the variable, exit 2."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        busy = str(holder.getsockname()[1])
        one_line(launch(COWRITE_JWT_SECRET=SECRET, **{variable: busy}),
                 f"{variable}: cannot listen on that port of COWRITE_HOST "
                 "(Address already in use)")


def test_a_busy_metrics_port_is_one_line_and_a_free_one_serves() -> None:
    busy_port_start("COWRITE_METRICS_PORT")
    port, metrics_port = free_port(), free_port()
    keep = {k: v for k, v in os.environ.items() if not k.startswith("COWRITE_")}
    env = {**keep, "COWRITE_JWT_SECRET": SECRET, "COWRITE_PORT": str(port),
           "COWRITE_METRICS_PORT": str(metrics_port)}
    with subprocess.Popen([sys.executable, "-m", "server"], env=env, stderr=subprocess.PIPE,
                          text=True) as server:
        assert server.stderr is not None
        try:
            for line in server.stderr:
                if "serving" in line:
                    break
            assert httpx.get(f"http://127.0.0.1:{metrics_port}/metrics").status_code == 200
            assert httpx.get(f"http://127.0.0.1:{port}/metrics").status_code == 404
        finally:
            server.terminate()
            server.communicate(timeout=30)


def test_a_busy_port_is_one_line_exit_2() -> None:
    """It was uvicorn's `[Errno 98] error while attempting to bind` and exit 3, after
    the lifespan had started (and stopped) every service."""
    busy_port_start("COWRITE_PORT")


@pytest.mark.parametrize("url", ["redis://127.0.0.1:s3cret-pass/0", "localhost:6380"])
def test_a_bad_redis_url_is_one_line_naming_it_and_not_its_value(url: str) -> None:
    line = one_line(launch(COWRITE_JWT_SECRET=SECRET, COWRITE_REDIS_URL=url),
                    "cowrite: COWRITE_REDIS_URL: ")
    assert "s3cret" not in line and "localhost" not in line


# --- every Bearer 401 carries its challenge -------------------------------------------------

@pytest.mark.parametrize("path", ["/v1/documents/d/history", "/v1/documents/d/threads",
                                  "/v1/tools", "/v1/workflows"])
async def test_a_401_carries_www_authenticate(path: str) -> None:
    async with running_server() as srv, httpx.AsyncClient(base_url=srv.http) as http:
        for headers in [{}, {"authorization": "Bearer not-a-jwt"},
                        {"authorization": f"Basic {token()}"}]:
            answer = await http.get(path, headers=headers)
            assert answer.status_code == 401, answer.text
            assert answer.headers["www-authenticate"] == CHALLENGE
        ok = await http.get(path, headers={"authorization": f"Bearer {token()}"})
        assert ok.status_code == 200, ok.text
