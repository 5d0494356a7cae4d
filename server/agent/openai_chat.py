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
import re
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
        self._secret = api_key
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
        except openai.APIStatusError as exc:  # reached: its answer may say the setup is wrong
            self._warm_answer(exc.status_code)
        except Exception as exc:  # down or slow now: the first run will say what is wrong
            logger.info("model upstream not reached while warming up (%s); the first run "
                        "will connect", type(exc).__name__)
        logger.debug("model client warmed in %.1f ms", (time.perf_counter() - started) * 1000)

    def _warm_answer(self, status: int) -> None:
        """The upstream answered the warm-up's `GET /models` with an error. A 404 or
        401 was logged as "not reached; the first run will connect", yet it was reached
        and every run would fail: the URL (typically without `/v1`) or the key is wrong.
        Neither the URL nor the key is printed."""
        if status == 404:
            path = self._client.base_url.path.rstrip("/")
            hint = "" if path.endswith("/v1") else (
                "; OpenAI-compatible servers usually serve under /v1: add /v1 to its end")
            logger.warning("model upstream answered 404 to GET /models while warming up: "
                           "check COWRITE_OPENAI_BASE_URL%s", hint)
        elif status in (401, 403):
            logger.warning("model upstream refused the API key (%d) while warming up: check "
                           "OPENAI_API_KEY (or COWRITE_OPENAI_API_KEY)", status)
        else:
            logger.info("model upstream answered %d while warming up; the first run will "
                        "try again", status)

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
            raise _model_error(exc, self._secret) from exc
        calls = _ToolCalls()
        usage: UsageChunk | None = None
        finish: str | None = None
        try:
            _check_streamed(upstream)
            async for chunk in upstream:
                if chunk.usage is not None:  # the last one counts (some servers repeat it)
                    usage = _usage(chunk.usage)
                for choice in chunk.choices:
                    finish = choice.finish_reason or finish
                    delta = choice.delta
                    if delta is None:
                        continue
                    if delta.content:
                        yield TextChunk(unicode_text(delta.content))
                    for part in delta.tool_calls or ():
                        calls.add(part)
            requested = calls.requests()
        except openai.APIError as exc:
            raise _model_error(exc, self._secret) from exc
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ModelError("bad_request", public="the model server sent a malformed stream",
                             detail=_redacted(f"malformed stream: {exc!r}", self._secret)
                             ) from exc
        finally:
            await upstream.close()
        _check_finish(finish)
        if usage is not None:
            yield usage
        for call in requested:
            yield call


class _ToolCalls:
    """Tool-call parts assembled into calls: by `index`, as the API sends them; parts
    without one (some servers) start a new call whenever they carry an id (they
    were glued into one call named `read_documentread_document`)."""

    def __init__(self) -> None:
        self._indexed: dict[int, dict[str, str]] = {}
        self._unindexed: list[dict[str, str]] = []

    def add(self, part: Any) -> None:
        if part.index is not None:
            slot = self._indexed.setdefault(int(part.index), _slot())
        elif part.id or not self._unindexed:
            slot = _slot()
            self._unindexed.append(slot)
        else:
            slot = self._unindexed[-1]
        if part.id:
            slot["id"] = part.id
        if part.function is not None:
            slot["name"] += part.function.name or ""
            slot["arguments"] += part.function.arguments or ""

    def requests(self) -> list[ToolCallRequest]:
        slots = [self._indexed[i] for i in sorted(self._indexed)] + self._unindexed
        for number, slot in enumerate(slots):
            if not slot["name"]:
                raise ModelError("bad_request", public=f"the model sent a tool call (number "
                                                       f"{number}) without a name")
        return [ToolCallRequest(unicode_text(slot["id"]), unicode_text(slot["name"]),
                                unicode_text(slot["arguments"]) or "{}") for slot in slots]


def unicode_text(text: str) -> str:
    """`text` with each lone surrogate as U+FFFD. JSON may escape one (`"\\ud800"`) and
    the SDK's decoder lets it through; UTF-8 cannot hold it, so the log refused the
    event: the run failed, or never ended, and the thread's history stayed unreadable.
    A pair cut across chunks (joined here for tool calls) is kept whole."""
    if text.isascii():
        return text
    try:
        text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


def _slot() -> dict[str, str]:
    return {"id": "", "name": "", "arguments": ""}


def _usage(usage: Any) -> UsageChunk:
    """Token counts, a missing or non-integer one as 0 (seen: a null completion_tokens)."""
    counts = {}
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        value = getattr(usage, key, None)
        counts[key] = value if isinstance(value, int) and not isinstance(value, bool) else 0
    return UsageChunk(counts)


def _check_streamed(upstream: Any) -> None:
    """A server that ignored `stream: true` (a whole JSON completion) or is not a model
    server at all (an HTML page behind a wrong base URL) sent no events: the run
    ended `completed` with nothing said."""
    response = getattr(upstream, "response", None)
    content_type = response.headers.get("content-type", "") if response is not None else ""
    if content_type and "event-stream" not in content_type.lower():  # none: let it parse
        raise ModelError("bad_request", public="the model server did not stream its answer",
                         detail=f"content-type {content_type[:100]!r}, not text/event-stream")


def _check_finish(finish: str | None) -> None:
    """An answer cut short is a failure, not a completed run (the text so far is kept,
    marked interrupted, as for any failed model call)."""
    if finish is None:
        raise ModelError("connection", public="the model's answer ended early (the stream "
                                              "stopped without a finish reason)")
    if finish == "length":
        raise ModelError("bad_request", public="the model's answer was cut at its length "
                                               "limit (finish_reason length)")
    if finish == "content_filter":
        raise ModelError("bad_request", public="the model provider withheld the rest of the "
                                               "answer (finish_reason content_filter)")


_KEY_SHAPED = re.compile(r"\b(?:sk|pk|rk)-[A-Za-z0-9_\-]{8,}")


def _redacted(text: str, secret: str) -> str:
    """`text` without the API key, or anything shaped like one (a provider's error may
    quote the key it was given; PROTOCOL.md section 10: the log never holds it)."""
    if len(secret) >= 8:
        text = text.replace(secret, "[redacted]")
    return _KEY_SHAPED.sub("[redacted]", text)


def _model_error(exc: openai.APIError, secret: str = "") -> ModelError:
    """Our words for an upstream failure; the provider's text goes to the log only."""
    detail = _redacted(f"{type(exc).__name__}: {exc.message}"[:500], secret)
    if isinstance(exc, openai.APIStatusError):
        return ModelError(_kind_of_status(exc.status_code), exc.status_code, detail=detail)
    if isinstance(exc, openai.APITimeoutError):
        return ModelError("timeout", detail=detail)
    if isinstance(exc, openai.APIConnectionError):
        return ModelError("connection", detail=detail)
    return ModelError(_kind_in_stream(exc.body), detail=detail)


def _kind_of_status(status: int) -> UpstreamKind:
    return ("rate_limited" if status == 429 else "auth" if status in (401, 403)
            else "server_error" if status >= 500 else "bad_request")


def _kind_in_stream(body: object) -> UpstreamKind:
    """The kind of an error sent inside the stream (`data: {"error": ...}`), from its code
    or type: an overloaded server said "bad request" and clients did not retry."""
    error = body.get("error", body) if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return "bad_request"
    code, kind = error.get("code"), str(error.get("type") or "")
    if isinstance(code, str) and code.isdigit():
        code = int(code)
    if isinstance(code, int) and not isinstance(code, bool) and 400 <= code < 600:
        return _kind_of_status(code)
    words = f"{code} {kind}".lower()
    if "rate" in words:
        return "rate_limited"
    if any(word in words for word in ("overload", "server", "unavailable", "internal")):
        return "server_error"
    return "bad_request"
