"""`OpenAIChat`: chat completions over the `openai` SDK, streamed.

Works with any OpenAI-compatible server (`COWRITE_OPENAI_BASE_URL`). Tool
call arguments arrive as deltas keyed by `index` and are assembled here;
usage arrives on a final chunk because we ask for `include_usage`. The
upstream HTTP response is closed in `finally`, so cancelling the run closes
the request at once.
"""

from collections.abc import AsyncIterator
from typing import Any

import openai

from server.agent.llm import (
    ModelChunk,
    ModelError,
    ModelRequest,
    TextChunk,
    ToolCallRequest,
    UpstreamKind,
    UsageChunk,
)


class OpenAIChat:
    def __init__(self, api_key: str, base_url: str | None, timeout_s: float = 120.0) -> None:
        self._client = openai.AsyncOpenAI(
            api_key=api_key, base_url=base_url, timeout=timeout_s, max_retries=1
        )

    async def close(self) -> None:
        await self._client.close()

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        options: dict[str, Any] = {}
        if request.tools:
            options["tools"] = request.tools
        try:
            # The SDK's overloads want TypedDicts; our messages are plain JSON objects.
            create: Any = self._client.chat.completions.create
            upstream = await create(
                model=request.model,
                messages=request.messages,
                stream=True,
                stream_options={"include_usage": True},
                **options,
            )
        except openai.APIError as exc:
            raise _model_error(exc) from exc
        calls: dict[int, dict[str, str]] = {}
        try:
            async for chunk in upstream:
                if chunk.usage is not None:
                    yield UsageChunk({
                        "prompt_tokens": chunk.usage.prompt_tokens,
                        "completion_tokens": chunk.usage.completion_tokens,
                        "total_tokens": chunk.usage.total_tokens,
                    })
                for choice in chunk.choices:
                    delta = choice.delta
                    if delta is None:
                        continue
                    if delta.content:
                        yield TextChunk(delta.content)
                    for part in delta.tool_calls or ():
                        slot = calls.setdefault(part.index, {"id": "", "name": "", "arguments": ""})
                        if part.id:
                            slot["id"] = part.id
                        if part.function is not None:
                            slot["name"] += part.function.name or ""
                            slot["arguments"] += part.function.arguments or ""
        except openai.APIError as exc:
            raise _model_error(exc) from exc
        except (ValueError, KeyError, TypeError) as exc:
            raise ModelError("bad_request", public="the model server sent a malformed stream",
                             detail=f"malformed stream: {exc!r}") from exc
        finally:
            await upstream.close()
        for index in sorted(calls):
            slot = calls[index]
            if not slot["name"]:
                raise ModelError("bad_request",
                                 public=f"the model sent a tool call (index {index}) without a "
                                        "name")
            yield ToolCallRequest(slot["id"], slot["name"], slot["arguments"] or "{}")


def _model_error(exc: openai.APIError) -> ModelError:
    """Our words for an upstream failure; the provider's text goes to the log only."""
    detail = f"{type(exc).__name__}: {exc.message}"[:500]
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        kind: UpstreamKind = (
            "rate_limited" if status == 429 else "auth" if status in (401, 403)
            else "server_error" if status >= 500 else "bad_request")
        return ModelError(kind, status, detail=detail)
    if isinstance(exc, openai.APITimeoutError):
        return ModelError("timeout", detail=detail)
    if isinstance(exc, openai.APIConnectionError):
        return ModelError("connection", detail=detail)
    return ModelError("bad_request", detail=detail)
