"""Conversation history: what is recorded per document, and what the model sees.

Recorded entries have the shape of `GET /v1/documents/{id}/history`. The
model sees earlier runs as user prompts and assistant texts only; their tool
traffic is left out (the current document travels in the run's context), so
old tool messages never need their assistant `tool_calls` partner.
"""

from typing import Any

import orjson

from protocol.base import DEFAULT_THREAD
from protocol.client import RunContext

HISTORY_TURNS_FOR_MODEL = 40
HISTORY_CHARS_FOR_MODEL = 24_000  # COWRITE_HISTORY_MAX_CHARS
NO_ANSWER = "[No answer: that run ended before the assistant replied.]"


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


def thread_of(entry: dict[str, Any]) -> str:
    """Entries written before threads existed belong to the default thread."""
    return str(entry.get("thread_id") or DEFAULT_THREAD)


def model_messages(
    system_prompt: str, history: list[dict[str, Any]], run_id: str, prompt: str,
    context: RunContext | None, thread_id: str = DEFAULT_THREAD,
    budget_chars: int = HISTORY_CHARS_FOR_MODEL,
) -> list[dict[str, Any]]:
    """The first request of a run: system, earlier turns of its thread (the newest that
    fit `budget_chars`, see `within_budget`), this prompt with its context."""
    return [
        {"role": "system", "content": system_prompt},
        *within_budget(earlier_turns(history, run_id, thread_id)[-HISTORY_TURNS_FOR_MODEL:],
                       budget_chars),
        {"role": "user", "content": user_content(prompt, context)},
    ]


def within_budget(turns: list[dict[str, Any]], budget_chars: int) -> list[dict[str, Any]]:
    """The newest turns whose text fits `budget_chars`, each turn cut to a quarter of it
    (its start and end kept), starting with a user turn. Without a budget, a thread
    whose long answers filled the model's context failed every later run with HTTP
    400, and each retry too, until ~20 more runs had pushed them out."""
    if budget_chars <= 0:
        return []
    turn_max, kept, used = max(budget_chars // 4, 200), [], 0
    for turn in reversed(turns):
        content = _shortened(str(turn["content"]), turn_max)
        if used + len(content) > budget_chars:
            break
        kept.append({**turn, "content": content})
        used += len(content)
    kept.reverse()
    while kept and kept[0]["role"] != "user":
        kept.pop(0)
    return kept


def _shortened(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    half = (limit - 60) // 2
    return (f"{text[:half]}\n[... {len(text) - 2 * half} characters left out ...]\n"
            f"{text[-half:]}")


def earlier_turns(history: list[dict[str, Any]], run_id: str, thread_id: str
                  ) -> list[dict[str, Any]]:
    """Earlier runs as the model should read them: an answer cut short says so (and by
    what), and a run that ended before any answer gets an assistant turn saying that,
    so user and assistant turns alternate."""
    turns: list[dict[str, Any]] = []
    for entry in history:
        if entry.get("role") not in ("user", "assistant") or entry.get("run_id") == run_id \
                or not entry.get("content") or thread_of(entry) != thread_id:
            continue
        content = str(entry["content"])
        if entry.get("interrupted"):
            cause = entry.get("interrupted_by") or "the run ended"
            content += f"\n\n[This answer was interrupted ({cause}) before it was finished.]"
        if entry["role"] == "user" and turns and turns[-1]["role"] == "user":
            turns.append({"role": "assistant", "content": NO_ANSWER})
        if entry["role"] == "assistant" and turns and turns[-1]["role"] == "assistant":
            turns[-1] = {"role": "assistant", "content": turns[-1]["content"] + "\n\n" + content}
            continue
        turns.append({"role": entry["role"], "content": content})
    if turns and turns[-1]["role"] == "user":
        turns.append({"role": "assistant", "content": NO_ANSWER})
    return turns


def threads(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`GET /v1/documents/{id}/threads`: each thread, its number of runs, its last activity."""
    found: dict[str, dict[str, Any]] = {}
    for entry in history:
        thread = found.setdefault(thread_of(entry), {"thread_id": thread_of(entry), "runs": 0,
                                                     "last_ts": None})
        if entry.get("role") == "user":
            thread["runs"] += 1
        if isinstance(entry.get("ts"), int):
            thread["last_ts"] = max(thread["last_ts"] or 0, entry["ts"])
    return sorted(found.values(), key=lambda t: -(t["last_ts"] or 0))


def prompt_entry(run_id: str, prompt: str, thread_id: str = DEFAULT_THREAD, ts: int = 0
                 ) -> dict[str, Any]:
    return {"role": "user", "content": prompt, "run_id": run_id, "thread_id": thread_id,
            "ts": ts}


def assistant_entry(run_id: str, text: str, interrupted: bool = False,
                    thread_id: str = DEFAULT_THREAD, interrupted_by: str | None = None
                    ) -> dict[str, Any]:
    entry: dict[str, Any] = {"role": "assistant", "content": text, "run_id": run_id,
                             "thread_id": thread_id}
    if interrupted:
        entry["interrupted"] = True
        if interrupted_by:
            entry["interrupted_by"] = interrupted_by
    return entry


def tool_entry(run_id: str, call_id: str, name: str, content: str,
               thread_id: str = DEFAULT_THREAD) -> dict[str, Any]:
    return {"role": "tool", "content": content, "run_id": run_id, "tool_call_id": call_id,
            "name": name, "thread_id": thread_id}


def assistant_turn(json_tools: bool, text: str, raw: str | None,
                   calls: list[tuple[str, str, str]]) -> dict[str, Any]:
    """The model's turn as its next request repeats it: with `tool_calls` (native
    function calling) or as the raw JSON answer it wrote (the JSON tool format)."""
    if json_tools:
        return {"role": "assistant", "content": raw or text}
    return {"role": "assistant", "content": text or None, "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        for call_id, name, arguments in calls]}


def tool_message(json_tools: bool, call_id: str, name: str, content: str) -> dict[str, Any]:
    """A tool's outcome as the model reads it."""
    if json_tools:
        return {"role": "user", "content": f"Result of tool {name}: {content}"}
    return {"role": "tool", "tool_call_id": call_id, "content": content}
