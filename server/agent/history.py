"""Conversation history: what is recorded per document, and what the model sees.

Recorded entries have the shape of `GET /v1/documents/{id}/history`. The
model sees earlier runs as user prompts and assistant texts only; their tool
traffic is left out (the current document travels in the run's context), so
old tool messages never need their assistant `tool_calls` partner.
"""

from typing import Any

import orjson

from protocol.client import RunContext

HISTORY_TURNS_FOR_MODEL = 40


def _json(value: Any) -> str:
    try:
        return orjson.dumps(value).decode()
    except (TypeError, ValueError):  # nested beyond what the encoder takes
        return '"(too deeply nested to show)"'


def user_content(prompt: str, context: RunContext | None) -> str:
    parts = [prompt]
    if context is not None:
        if context.document is not None:
            version = f" (version {context.document.version})" if context.document.version else ""
            fmt = f", format {context.document.format}" if context.document.format else ""
            parts.append(f"\n\n<document{version}{fmt}>\n{context.document.text}\n</document>")
        if context.selection is not None:
            parts.append(f"\n\n<selection>{_json(context.selection)}</selection>")
        if context.extra is not None:
            parts.append(f"\n\n<extra>{_json(context.extra)}</extra>")
    return "".join(parts)


def model_messages(
    system_prompt: str, history: list[dict[str, Any]], run_id: str, prompt: str,
    context: RunContext | None,
) -> list[dict[str, Any]]:
    """The first request of a run: system, earlier turns, this prompt with its context."""
    earlier = [
        {"role": entry["role"], "content": str(entry["content"])}
        for entry in history
        if entry.get("role") in ("user", "assistant") and entry.get("run_id") != run_id
        and entry.get("content")
    ][-HISTORY_TURNS_FOR_MODEL:]
    return [
        {"role": "system", "content": system_prompt},
        *earlier,
        {"role": "user", "content": user_content(prompt, context)},
    ]


def prompt_entry(run_id: str, prompt: str) -> dict[str, Any]:
    return {"role": "user", "content": prompt, "run_id": run_id}


def assistant_entry(run_id: str, text: str, interrupted: bool = False) -> dict[str, Any]:
    entry: dict[str, Any] = {"role": "assistant", "content": text, "run_id": run_id}
    if interrupted:
        entry["interrupted"] = True
    return entry


def tool_entry(run_id: str, call_id: str, name: str, content: str) -> dict[str, Any]:
    return {"role": "tool", "content": content, "run_id": run_id, "tool_call_id": call_id,
            "name": name}
