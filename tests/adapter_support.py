"""What the adapter tests share: reading an adapter's SSE answer as a frontend would."""

from typing import Any

import httpx
import orjson

from tests.harness import token


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
