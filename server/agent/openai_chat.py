"""`OpenAIChat`: chat completions over the `openai` SDK, streamed.

Works with any OpenAI-compatible server (`COWRITE_OPENAI_BASE_URL`). Tool
call arguments arrive as deltas keyed by `index` and are assembled here;
usage arrives on a final chunk because we ask for `include_usage`. The
upstream HTTP response is closed in `finally`, so cancelling the run closes
the request at once.

`warm()` (awaited by the app's lifespan) pays the SDK's cold start before the
first run: the lazily imported chat resources, the first parse of a stream
chunk, and a pooled connection to the upstream, opened with `GET /models`
(free, no tokens). httpx keeps an idle pooled connection 5 s, so a run that
comes much later reconnects; the Python-side costs stay paid.
"""

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import openai
from openai.types.chat import ChatCompletionChunk

from server.agent.llm import (
    ModelChunk,
    ModelError,
    ModelRequest,
    TextChunk,
    ToolCallRequest,
    UpstreamKind,
    UsageChunk,
)

logger = logging.getLogger("cowrite.agent")


class OpenAIChat:
    def __init__(self, api_key: str, base_url: str | None, timeout_s: float = 120.0) -> None:
        self._client = openai.AsyncOpenAI(
            api_key=api_key, base_url=base_url, timeout=timeout_s, max_retries=1
        )

    async def close(self) -> None:
        await self._client.close()

    async def warm(self, timeout_s: float) -> None:
        """Get the client ready for the first run; never fails (an upstream that
        is down now may be up by the first run, which reports it properly)."""
        started = time.perf_counter()
        _ = self._client.chat.completions.create  # imports the chat resources
        chunk = {"id": "warm", "object": "chat.completion.chunk", "created": 0, "model": "warm",
                 "choices": [{"index": 0, "delta": {"content": "", "tool_calls": [{
                     "index": 0, "id": "c", "type": "function",
                     "function": {"name": "f", "arguments": ""}}]}, "finish_reason": None}],
                 "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
        ChatCompletionChunk.model_validate(chunk)
        with contextlib.suppress(Exception):  # the SDK's private helpers: best effort
            from openai._models import construct_type
            from openai._utils import async_maybe_transform
            from openai.types.chat import completion_create_params

            construct_type(type_=ChatCompletionChunk, value=chunk)  # how streams parse
            await async_maybe_transform(  # the request body's first transform
                {"model": "warm", "messages": [{"role": "user", "content": "warm"}],
                 "stream": True, "stream_options": {"include_usage": True},
                 "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]},
                completion_create_params.CompletionCreateParamsStreaming)
        try:
            async with asyncio.timeout(timeout_s):
                await self._client.models.list()
        except Exception as exc:  # any failure: the first run will say what is wrong
            logger.info("model upstream not reached while warming up (%s); the first run "
                        "will connect", type(exc).__name__)
        logger.debug("model client warmed in %.1f ms", (time.perf_counter() - started) * 1000)

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        options: dict[str, Any] = {}
        if request.tools:
            options["tools"] = request.tools
        try:
            # The SDK's overloads want TypedDicts; our messages are plain JSON objects.
            create: Any = self._client.chat.completions.create
            upstream = await create(
                model=request.model,
                messages=list(request.messages),  # the SDK encodes lists (the run's is Grown)
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
