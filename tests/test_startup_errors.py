"""A start-up that cannot go on says why in one line per problem, exit code 2, with no
traceback and no value from the environment (a bad setting printed pydantic's dump of
every setting: the start of the JWT secret and the whole OpenAI key)."""

import os
import subprocess
import sys
import time

import pytest

from tests.harness import free_port

API_KEY = "sk-proj-AbCdEf1234567890"
JWT_SECRET = "prod-jwt-secret-7f3a9c2e1b-0123456789abcdef"


def start(**env: str) -> subprocess.CompletedProcess[str]:
    keep = {k: v for k, v in os.environ.items() if not k.startswith("COWRITE_")
            and k != "OPENAI_API_KEY"}
    return subprocess.run([sys.executable, "-m", "server"], env={**keep, **env},
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(("env", "said"), [
    ({"COWRITE_MAX_MESSAGE_BYTES": "512"}, ["COWRITE_MAX_MESSAGE_BYTES must be at least 1024"]),
    ({"COWRITE_PORT": "abc", "COWRITE_DEV": "maybe"},
     ["COWRITE_PORT: Input should be a valid integer", "COWRITE_DEV: Input should be a valid "
                                                       "boolean"]),
    ({"COWRITE_LLM": "anthropic"}, ["COWRITE_LLM: Input should be 'scripted' or 'openai'"]),
    ({"COWRITE_LOG_LEVEL": "verbose"}, ["COWRITE_LOG_LEVEL must be one of debug"]),
    ({"COWRITE_JWT_SECRET": "", "COWRITE_JWT_PUBLIC_KEY": "not a pem"},
     ["COWRITE_JWT_PUBLIC_KEY is not a PEM public key"]),
    ({"COWRITE_REDIS_URL": "localhost:6380"}, ["Redis URL must specify one of the following"]),
    ({"COWRITE_METRICS_TOKEN": " "}, ["COWRITE_METRICS_TOKEN is empty: give a token"]),
], ids=["range", "types", "choice", "log-level", "public-key", "redis-url", "metrics-token"])
def test_a_bad_setting_is_one_line_naming_it_and_no_secret(env: dict[str, str],
                                                            said: list[str]) -> None:
    ended = start(**{"COWRITE_JWT_SECRET": JWT_SECRET, "OPENAI_API_KEY": API_KEY, **env})
    lines = ended.stderr.strip().splitlines()
    assert ended.returncode == 2, ended.stderr
    assert len(lines) == len(said) and all(line.startswith("cowrite: ") for line in lines)
    for line, words in zip(lines, said, strict=True):
        assert words in line
    assert "Traceback" not in ended.stderr
    assert API_KEY[:12] not in ended.stderr and JWT_SECRET[:12] not in ended.stderr


def test_a_short_jwt_secret_is_warned_about_at_start() -> None:
    keep = {k: v for k, v in os.environ.items() if not k.startswith("COWRITE_")}
    with subprocess.Popen([sys.executable, "-m", "server"], stderr=subprocess.PIPE, text=True,
                          env={**keep, "COWRITE_JWT_SECRET": "change-me",
                               "COWRITE_PORT": "0"}) as server:
        assert server.stderr is not None
        lines = []
        for line in server.stderr:
            lines.append(line)
            if "serving" in line:
                break
        server.terminate()
    assert any("COWRITE_JWT_SECRET is 9 bytes; HS256 wants at least 32" in line
               for line in lines), lines


def test_an_unreachable_redis_is_said_once_not_twice_a_second() -> None:
    """The banner says Redis does not answer, and each reader says it lost Redis once
    per outage (a wrong URL logged two warnings a second, under a plain "serving")."""
    keep = {k: v for k, v in os.environ.items() if not k.startswith("COWRITE_")}
    env = {**keep, "COWRITE_JWT_SECRET": JWT_SECRET, "COWRITE_PORT": "0",
           "COWRITE_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}
    with subprocess.Popen([sys.executable, "-m", "server"], stderr=subprocess.PIPE, text=True,
                          env=env) as server:
        time.sleep(6)  # a dozen reconnect attempts at the old fixed pace
        server.terminate()
        _, err = server.communicate(timeout=20)
    banner = next(line for line in err.splitlines() if "serving" in line)
    assert "Redis does not answer (check COWRITE_REDIS_URL)" in banner
    assert err.count("redis pub/sub lost") == 1 and err.count("inbox read failed") == 1, err
