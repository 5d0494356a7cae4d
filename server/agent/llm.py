"""The model seam: an `LLM` streams text chunks, then complete tool calls.

Two implementations: `ScriptedLLM` (no network; PROTOCOL.md section 9) and
`OpenAIChat` (the `openai` SDK against any OpenAI-compatible server). The
run loop consumes `stream()` as an async iterator; cancelling the consuming
task closes the iterator, which must close the upstream request at once.
"""

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from protocol.client import RunContext, ToolSpec


@dataclass(frozen=True, slots=True)
class TextChunk:
    text: str


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


@dataclass(frozen=True)
class ModelRequest:
    """Everything one model call sees."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]  # OpenAI `tools` entries; empty = no tools offered
    model: str
    # What the scripted model reads; a real model only sees `messages`.
    run_id: str = ""
    step: int = 0
    prompt: str = ""
    context: RunContext | None = None
    client_tools: list[ToolSpec] = field(default_factory=list)
    tool_results: list[dict[str, Any]] = field(default_factory=list)


class ModelError(Exception):
    """The model failed (HTTP error, malformed stream): the run ends `upstream_error`."""


class LLM(Protocol):
    def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]: ...

    async def close(self) -> None: ...
