"""What the adapter tests share: reading an adapter's SSE answer as a frontend would,
and handing what it read to the real npm frontend packages (`ai`, `@ag-ui/client`)."""

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.harness import token

NODE_DIR = Path(__file__).parent / "node"


async def sse(http: httpx.AsyncClient, method: str, url: str, body: Any = None,
              sub: str = "alice", headers: dict[str, str] | None = None
              ) -> tuple[int, list[Any]]:
    """(status, the `data:` items: JSON values, and "[DONE]" as is); on an error
    status, the error body as the one item. `headers` are sent besides the token."""
    items: list[Any] = []
    headers = {"Authorization": f"Bearer {token(sub)}", **(headers or {})}
    async with http.stream(method, url, headers=headers, json=body, timeout=15) as response:
        if response.status_code != 200:
            await response.aread()
            return response.status_code, [response.json()] if response.content else []
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                data = line[len("data: "):]
                items.append(data if data == "[DONE]" else orjson.loads(data))
    return 200, items


def user_message(text: str) -> dict[str, Any]:
    """An AI SDK UI message of the user's."""
    return {"id": "u1", "role": "user", "parts": [{"type": "text", "text": text}]}


def node_json(script: str, data: object, package: str) -> Any:
    """What an ES module `script` run by node in tests/node (where its npm packages
    are) prints as JSON, given `data` as JSON on stdin: how a test asks the real
    frontend package what it makes of the events an adapter sent. Without node or
    `package` (in tests/node/node_modules) it skips, but fails in CI (`CI=true`),
    where a skipped test would hide a feature nobody checked."""
    node = shutil.which("node")
    if node is None or not (NODE_DIR / "node_modules" / package).is_dir():
        if os.environ.get("CI") == "true":
            pytest.fail("node and tests/node's npm packages are required in CI (make node-deps)")
        pytest.skip("node and the npm packages (make node-deps) are needed")
    done = subprocess.run([node, "--input-type=module", "-e", script], cwd=NODE_DIR,
                          input=json.dumps(data), capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, f"node exited {done.returncode}: {done.stderr}"
    return json.loads(done.stdout)
