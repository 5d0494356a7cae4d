"""The model seam: an `LLM` streams text chunks, then complete tool calls.

Two implementations: `ScriptedLLM` (no network; PROTOCOL.md section 9) and
`OpenAIChat` (the `openai` SDK against any OpenAI-compatible server). The
run loop consumes `stream()` as an async iterator; cancelling the consuming
task closes the iterator, which must close the upstream request at once.
"""

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from protocol.client import RunContext, ToolSpec
from server.records import quick_init


@dataclass(frozen=True, slots=True)
class TextChunk:
    text: str


@quick_init
@dataclass(frozen=True, slots=True)
class ToolCallRequest:
    """A complete tool call the model asked for; `arguments` is the raw JSON text."""

    call_id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class UsageChunk:
    usage: dict[str, int]


ModelChunk = TextChunk | ToolCallRequest | UsageChunk


@quick_init
@dataclass(frozen=True, slots=True)
class ModelRequest:
    """Everything one model call sees. Sequences, not lists: the run's own tuples are
    handed over as they are (they grow with every call of a run; copying them per
    model turn cost more than the rest of the request)."""

    messages: Sequence[dict[str, Any]]
    tools: list[dict[str, Any]]  # OpenAI `tools` entries; empty = no tools offered
    model: str
    # What the scripted model reads; a real model only sees `messages`.
    run_id: str = ""
    step: int = 0
    prompt: str = ""
    context: RunContext | None = None
    client_tools: Sequence[ToolSpec] = ()
    tool_results: Sequence[dict[str, Any]] = ()


UpstreamKind = Literal["rate_limited", "auth", "bad_request", "server_error", "timeout",
                      "connection"]


class ModelError(Exception):
    """The model failed (HTTP error, malformed stream): the run ends `upstream_error`.

    `public` is the only text that reaches clients (PROTOCOL.md section 10): it
    names the HTTP status and the kind, never the provider's body or an
    exception's text, which go to the log only."""

    def __init__(self, kind: UpstreamKind, status: int | None = None,
                 public: str | None = None, detail: str = "") -> None:
        self.kind = kind
        self.status = status
        where = f"HTTP {status}" if status is not None else kind.replace("_", " ")
        self.public = public or f"the model server failed ({where}, {kind})"
        super().__init__(detail or self.public)

    @property
    def details(self) -> dict[str, Any]:
        found: dict[str, Any] = {"kind": self.kind}
        if self.status is not None:
            found["status"] = self.status
        return found


class LLM(Protocol):
    def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]: ...

    async def close(self) -> None: ...


@runtime_checkable
class Warmable(Protocol):
    """A model with a cold start worth paying before the first run (imports, the
    HTTP client, its connection pool): the app's lifespan awaits `warm` once."""

    async def warm(self, timeout_s: float) -> None: ...
