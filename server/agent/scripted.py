"""`ScriptedLLM`: a model that needs no network (PROTOCOL.md section 9).

A prompt that is a JSON object with a `script` key is followed one element
per model call. Beyond the protocol text, two test conveniences: a step may
say `{"fail": "message"}` to act as an upstream failure, and a tool call's
`arguments` may be a string, sent to the loop as raw (possibly invalid) JSON.

Any other prompt gets the demo: read the document with the client's
`read_document` tool, then edit it visibly (`insert_text`, or
`replace_document`, which the test page guards with an approval, when the
prompt asks to rewrite or replace), with streamed commentary.

Pacing: every scripted stream of a process waits on one shared timer per due
millisecond (`_Pacer`), not a timer of its own per piece: with 1,000 streams
50 pieces a second apart, that is at most 1,000 timers a second instead of
50,000. Each piece comes `delay_ms` after the previous one was taken, so a
busy server slows the stream down. With `"catch_up": true` (a load-test
option) the pieces are due on the model's own clock instead, `delay_ms`
apart from the start of the call, as a real upstream produces them whatever
the reader does; a stream the server gets to late takes every piece already
due as one chunk, as a reader takes several SSE events waiting in its socket
in one read.
"""

import asyncio
import functools
import math
import random
import weakref
from collections.abc import AsyncIterator
from typing import Any

import orjson

from server.agent.llm import ModelChunk, ModelError, ModelRequest, TextChunk, ToolCallRequest


@functools.lru_cache(maxsize=256)
def parse_script(prompt: str) -> dict[str, Any] | None:
    """The script of a prompt (cached: a run asks once per model call)."""
    if not prompt.lstrip().startswith("{"):
        return None
    try:
        data = orjson.loads(prompt)
    except orjson.JSONDecodeError:
        return None
    if isinstance(data, dict) and isinstance(data.get("script"), list):
        return data
    return None


class _Pacer:
    """The scripted streams' clock: one loop timer per due millisecond, shared
    by every stream of the model due then (one per event loop)."""

    __slots__ = ("_due",)

    def __init__(self) -> None:
        self._due: dict[int, list[asyncio.Future[None]]] = {}

    def until(self, loop: asyncio.AbstractEventLoop, when: float) -> "asyncio.Future[None]":
        """A future done at loop time `when` (rounded up to the millisecond)."""
        tick = math.ceil(when * 1000)
        waiters = self._due.get(tick)
        if waiters is None:
            waiters = self._due[tick] = []
            loop.call_at(tick / 1000, self._fire, tick)
        future = loop.create_future()
        waiters.append(future)
        return future

    def _fire(self, tick: int) -> None:
        for future in self._due.pop(tick, ()):
            if not future.done():  # a cancelled stream left its future behind
                future.set_result(None)


class ScriptedLLM:
    # The driver may start a turn in its own task (driver._start_model_eagerly): a
    # scripted turn binds nothing (timeouts, cancel scopes) to the task that starts it.
    eager_turns = True

    def __init__(self) -> None:
        self._pacers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Pacer] = \
            weakref.WeakKeyDictionary()

    async def close(self) -> None:
        return None

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        script = parse_script(request.prompt)
        catch_up = False
        if script is not None:
            steps: list[Any] = script["script"]
            step = steps[request.step] if request.step < len(steps) else {}
            chunk_chars = max(1, int(script.get("chunk_chars", 4)))
            delay = max(0.0, float(script.get("delay_ms", 0)) / 1000)
            catch_up = script.get("catch_up") is True
        else:
            step = _demo_step(request)
            chunk_chars, delay = 6, 0.015
        if not isinstance(step, dict):
            raise ModelError("bad_request",
                             public=f"script element {request.step} is not an object")
        say = str(step.get("say") or "")
        count = -(-len(say) // chunk_chars)
        if delay <= 0:
            for index in range(count):
                await asyncio.sleep(0)
                yield TextChunk(say[index * chunk_chars:(index + 1) * chunk_chars])
        elif count:
            loop = asyncio.get_running_loop()
            pacer = self._pacers.get(loop)
            if pacer is None:
                pacer = self._pacers[loop] = _Pacer()
            begin, sent = loop.time(), 0
            while sent < count:
                due = begin + (sent + 1) * delay if catch_up else loop.time() + delay
                if due > loop.time():
                    await pacer.until(loop, due)
                upto = sent + 1
                if catch_up:  # every piece due by now comes in this chunk
                    upto = min(count, max(upto, int((loop.time() - begin) / delay + 1e-9)))
                yield TextChunk(say[sent * chunk_chars:upto * chunk_chars])
                sent = upto
        if step.get("fail"):
            # The scripted text is the test's own words, not an exception's.
            raise ModelError("server_error", public=str(step["fail"])[:500])
        for call in step.get("tool_calls") or ():
            arguments = call.get("arguments", {})
            raw = arguments if isinstance(arguments, str) else orjson.dumps(arguments).decode()
            # 10 random hex digits, as uuid4().hex[:10] gave. Not a secret (every reader of
            # the document sees it), so no system call for it: `random` (reseeded after fork).
            yield ToolCallRequest(f"call_{random.getrandbits(40):010x}", str(call.get("name")),
                                  raw)


def _demo_step(request: ModelRequest) -> dict[str, Any]:
    """The free-text demo: read, edit, summarize, using the declared tools."""
    declared = {tool.name for tool in request.client_tools}
    prompt = " ".join(request.prompt.split())[:200] or "your request"
    if not request.tools or not declared & {"read_document", "insert_text", "replace_document"}:
        words = len(request.context.document.text.split()) if (
            request.context and request.context.document) else 0
        note = f" The document you shared has {words} words." if words else ""
        return {"say": f"You asked: \u201c{prompt}\u201d. I am cowrite's scripted demo model, "
                       f"so I answer without a language model.{note}"}
    wants_rewrite = any(w in prompt.lower() for w in ("rewrite", "replace", "title"))
    if request.step == 0 and "read_document" in declared:
        return {"say": "Let me read the document first. ",
                "tool_calls": [{"name": "read_document", "arguments": {}}]}
    if request.step <= 1:
        text = _document_text(request)
        words = len(text.split())
        if wants_rewrite and "replace_document" in declared:
            title = prompt[:1].upper() + prompt[1:]
            return {"say": f"The document has {words} words. I will put a title on it; "
                           "this replaces the whole document, so I need your approval. ",
                    "tool_calls": [{"name": "replace_document",
                                    "arguments": {"text": f"# {title}\n\n{text}"}}]}
        if "insert_text" in declared:
            line = (f"\n\n\u270d cowrite: \u201c{prompt}\u201d \u2014 noted after reading "
                    f"{words} words.")
            return {"say": f"I read {words} words. Now I'll add a line at the end. ",
                    "tool_calls": [{"name": "insert_text",
                                    "arguments": {"text": line, "position": "end"}}]}
    outcome = _last_outcome(request)
    return {"say": f"Done. {outcome}"}


def _document_text(request: ModelRequest) -> str:
    for result in reversed(request.tool_results):
        if result.get("name") == "read_document":
            output = result.get("output")
            if isinstance(output, dict) and isinstance(output.get("text"), str):
                return str(output["text"])
            if isinstance(output, str):
                return output
    if request.context and request.context.document:
        return request.context.document.text
    return ""


def _last_outcome(request: ModelRequest) -> str:
    if not request.tool_results:
        return ""
    last = request.tool_results[-1]
    if last.get("status") == "rejected":
        return "You rejected the change, so I left the document as it was."
    if last.get("status") != "ok":
        return f"The last tool did not succeed ({last.get('status')})."
    return "The edit is in the document."
