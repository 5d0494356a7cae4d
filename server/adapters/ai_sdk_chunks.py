"""cowrite events -> Vercel AI SDK UI message stream chunks (pure, no I/O).

The chunk shapes are the `UIMessageChunk` union of the `ai` package (5 to 7):
one assistant UI message per run, whose id is the run id. Client tools are
static tool parts (`tool-<name>`), server tools dynamic ones marked
`providerExecuted`. An approval is shown as the tool's input plus
`tool-approval-request` (approval id = call id), without
`tool-input-available`, so `onToolCall` fires only once the call is approved
and really dispatched to the client. A segment ends after a client tool's
`tool-input-available` or an approval request (`finish` with
`finishReason: "tool-calls"`), and at the run's end: `finish` (`stop`),
`abort` for a cancelled or aborted run, `error` then `finish` (`error`) for a
failed or timed-out one.

Steps: content (text, a tool's input, an approval request) opens a step
(`start-step`), a segment's `finish` closes it (`finish-step`), content that
follows tool results opens the next one, as does the text of the next model
call (after one whose calls were all invalid: no tool events), and results that
open a segment (the client's answer) open the step the run goes on in. The AI SDK's
`lastAssistantMessageIsCompleteWithToolCalls` (what `useChat` apps pass as
`sendAutomaticallyWhen`) looks at the last step only: without steps, a finished
run whose tools all had their outputs looked like one waiting for them to be
sent, and the chat sent again, into a 409.

A run that moves to another instance (Redis) makes the model call that was
streaming again under a new message id, after `message.discarded`: a live
stream ends the discarded text part (`text-end`) and, when that text is all
its step holds (the model call's step), takes it back with `reset-step` (`ai`
7: "removes all message parts added during the current step"); the answer then
streams in the same step, as a replay shows it. `ai` 5 and 6 fail the chat on a
chunk type they do not know, so `reset-step` only reaches frontends that accept
it (`without_resets` leaves it out for the others, whose partial text stays
above the answer). A replay (a reconnect) leaves the discarded message out
(`discarded_text`), so the rebuilt message holds the answer once.
"""

from collections.abc import AsyncIterator, Sequence
from typing import Any

import orjson

from protocol.server import (
    ApprovalRequested,
    ApprovalResolved,
    MessageDelta,
    MessageDiscarded,
    MessageDone,
    RunFinished,
    ServerEvent,
    ToolCall,
    ToolDone,
)

Chunk = dict[str, Any]


class AiSdkTranslator:
    def __init__(self, message_id: str) -> None:
        self.message_id = message_id
        self.open_texts: list[str] = []
        self.discarded: set[str] = set()  # messages whose model call was made again
        self.shown_inputs: set[str] = set()  # calls whose input the client already has
        self.server_calls: set[str] = set()
        self.dynamic_calls: set[str] = set()  # shown as dynamic parts (static: the rest)
        self.step_open = False
        self.step_has_results = False  # a tool output came in the open step
        self.step_content: list[str] = []  # text and call ids shown in the open step

    def opening(self) -> list[Chunk]:
        # No step state here: a segment's `finish` closed its step, and an instance that
        # follows a run answered elsewhere opens its segment after translating the event.
        return [{"type": "start", "messageId": self.message_id}]

    def _content(self, message: str | None = None) -> list[Chunk]:
        """What goes before new content (`message`: a model call's text): a step opened,
        or the next one after results or after an earlier model call."""
        if self.step_open and not self.step_has_results and not self._next_call(message):
            return []
        chunks: list[Chunk] = [{"type": "finish-step"}] if self.step_open else []
        self.step_open, self.step_has_results, self.step_content = True, False, []
        return [*chunks, {"type": "start-step"}]

    def _next_call(self, message: str | None) -> bool:
        """Whether `message` begins after other content of the open step: the text of the
        next model call, which gets a step of its own. A model call whose calls were all
        invalid publishes no tool events, and the next call's text joined its step, where
        `reset-step` could not take it back when the run moved mid-text (a replay left it
        out). Never while another text is open: `finish-step` ends text parts in `ai` 5
        and 6, and that text's next chunk would fail the chat."""
        others = set(self.step_content) - {message}
        return message is not None and bool(others) and not others & set(self.open_texts)

    def _finish(self, reason: str) -> list[Chunk]:
        chunks: list[Chunk] = [{"type": "finish-step"}] if self.step_open else []
        self.step_open = self.step_has_results = False
        self.step_content = []
        return [*chunks, {"type": "finish", "finishReason": reason}]

    def _close_texts(self) -> list[Chunk]:
        chunks = [{"type": "text-end", "id": text_id} for text_id in self.open_texts]
        self.open_texts = []
        return chunks

    def translate(self, event: ServerEvent, ours: bool) -> tuple[list[Chunk], bool]:
        if isinstance(event, MessageDelta):
            chunks: list[Chunk] = []
            if event.message_id not in self.open_texts:
                self.open_texts.append(event.message_id)
                chunks += [*self._content(event.message_id),
                           {"type": "text-start", "id": event.message_id}]
                self.step_content.append(event.message_id)
            chunks.append({"type": "text-delta", "id": event.message_id, "delta": event.delta})
            return chunks, False
        if isinstance(event, MessageDone):
            if event.message_id in self.open_texts:
                self.open_texts.remove(event.message_id)
                return [{"type": "text-end", "id": event.message_id}], False
            if not event.text:
                return [], False
            chunks = [*self._content(event.message_id),
                      {"type": "text-start", "id": event.message_id},
                      {"type": "text-delta", "id": event.message_id, "delta": event.text},
                      {"type": "text-end", "id": event.message_id}]
            self.step_content.append(event.message_id)
            return chunks, False
        if isinstance(event, MessageDiscarded):
            return self._discarded(event.message_id), False
        if isinstance(event, ToolCall):
            return self._tool_call(event, ours)
        if isinstance(event, ApprovalRequested):
            chunks = [*self._close_texts(), *self._content(),
                      *self._input(event.call_id, event.name, event.arguments)]
            self.shown_inputs.add(event.call_id)
            self.step_content.append(event.call_id)
            chunks += [{"type": "tool-approval-request", "approvalId": event.call_id,
                        "toolCallId": event.call_id}, *self._finish("tool-calls")]
            return chunks, True
        if isinstance(event, ApprovalResolved):
            return [{"type": "tool-approval-response", "approvalId": event.call_id,
                     "approved": event.decision == "approve"}], False
        if isinstance(event, ToolDone):
            return self._tool_done(event), False
        if isinstance(event, RunFinished):
            return self._finished(event), True
        return [], False

    def _discarded(self, message_id: str) -> list[Chunk]:
        """The discarded message's text part ends; when it is all the open step shows (a
        model call's text comes first in its step), `reset-step` takes it back. With
        anything else in the step (a part this adapter never saw begin, after a log
        reset) the step stays: `reset-step` would take that too."""
        if message_id in self.discarded:
            return []
        self.discarded.add(message_id)
        chunks: list[Chunk] = []
        if message_id in self.open_texts:
            self.open_texts.remove(message_id)
            chunks.append({"type": "text-end", "id": message_id})
        if self.step_open and self.step_content == [message_id]:
            self.step_content = []
            chunks.append({"type": "reset-step"})
        return chunks

    def lost(self, message: str) -> list[Chunk]:
        """The link was lost mid-segment: the frontend's stream fails (`useChat` shows
        the error); its reconnect replays the run, which went on."""
        return [*self._close_texts(), {"type": "error", "errorText": message},
                *self._finish("error")]

    def _input(self, call_id: str, name: str, arguments: dict[str, Any],
               server: bool = False) -> list[Chunk]:
        extra: dict[str, Any] = {"dynamic": True, "providerExecuted": True} if server else {}
        if server:
            self.dynamic_calls.add(call_id)
        return [{"type": "tool-input-start", "toolCallId": call_id, "toolName": name, **extra},
                {"type": "tool-input-delta", "toolCallId": call_id,
                 "inputTextDelta": orjson.dumps(arguments).decode()}]

    def _tool_call(self, event: ToolCall, ours: bool) -> tuple[list[Chunk], bool]:
        server = event.executor == "server"
        if server:
            self.server_calls.add(event.call_id)
        chunks = self._close_texts()
        if event.call_id not in self.shown_inputs:
            chunks += [*self._content(),
                       *self._input(event.call_id, event.name, event.arguments, server)]
            self.shown_inputs.add(event.call_id)
            self.step_content.append(event.call_id)
        available: Chunk = {"type": "tool-input-available", "toolCallId": event.call_id,
                            "toolName": event.name, "input": event.arguments}
        available.update(self._executed(event.call_id))
        chunks.append(available)
        if ours:
            chunks += self._finish("tool-calls")
        return chunks, ours

    def _executed(self, call_id: str) -> dict[str, Any]:
        """A server call's marks, in the kind of part its input was first shown as: a
        server tool behind an approval was shown as a static part (the approval request
        does not say who runs the tool), and a `dynamic` mark later made the SDK add a
        second part for the same call, left `input-available` for ever."""
        if call_id not in self.server_calls:
            return {}
        if call_id in self.dynamic_calls:
            return {"dynamic": True, "providerExecuted": True}
        return {"providerExecuted": True}

    def _tool_done(self, event: ToolDone) -> list[Chunk]:
        if event.call_id not in self.shown_inputs:
            return []
        # Results in a step already open end it; results that open a segment (a client's
        # answer) open the step the run goes on in, so that the last step never holds
        # answered calls when the run ends, text after them or not.
        opened = [] if self.step_open else self._content()
        self.step_has_results = not opened
        extra = self._executed(event.call_id)
        if event.status == "ok":
            return [*opened, {"type": "tool-output-available", "toolCallId": event.call_id,
                              "output": event.output, **extra}]
        if event.status == "rejected":
            return [*opened, {"type": "tool-output-denied", "toolCallId": event.call_id}]
        message = str((event.error or {}).get("message", event.status))
        return [*opened, {"type": "tool-output-error", "toolCallId": event.call_id,
                          "errorText": f"{event.status}: {message}", **extra}]

    def _finished(self, event: RunFinished) -> list[Chunk]:
        chunks = self._close_texts()
        why = f"{event.status}" + (f": {event.reason}" if event.reason else "")
        if event.status == "completed":
            return [*chunks, *self._finish("stop")]
        if event.status in ("cancelled", "aborted"):
            return [*chunks, {"type": "abort", "reason": why}]
        text = f"run {why}" + (f" ({event.error.message})" if event.error else "")
        return [*chunks, {"type": "error", "errorText": text}, *self._finish("error")]


TEXT_CHUNKS = frozenset({"text-start", "text-delta", "text-end"})


def discarded_text(chunk: Chunk, discarded: set[str], dropping: set[str]) -> bool:
    """Whether a replay leaves `chunk` out: text of a message in `discarded`, and the
    `reset-step` that took such text back when the replay left the text out (it
    would take nothing back). Decided at the message's `text-start` (`dropping`
    holds the replay's decisions, and "" while a left-out text is the last text),
    so a message discarded while a replay streams it is ended and taken back there,
    never cut off unended."""
    kind = chunk.get("type")
    if kind == "reset-step":
        left_out = "" in dropping
        dropping.discard("")
        return left_out
    if kind not in TEXT_CHUNKS:
        return False
    text_id = chunk.get("id")
    if kind == "text-start" and text_id in discarded:
        dropping.add(str(text_id))
    dropping.discard("")
    if text_id in dropping:
        dropping.add("")
        return True
    return False


def without_resets(chunks: AsyncIterator[Chunk]) -> AsyncIterator[Chunk]:
    """`chunks` for a frontend that may run `ai` 5 or 6: without `reset-step`."""

    async def filtered() -> AsyncIterator[Chunk]:
        async for chunk in chunks:
            if chunk.get("type") != "reset-step":
                yield chunk

    return filtered()


ANSWERED = frozenset({"tool-output-available", "tool-output-error", "tool-output-denied"})


def answered_calls(chunks: Sequence[Chunk]) -> frozenset[str]:
    """The calls whose outcome `chunks` already show."""
    return frozenset(str(c.get("toolCallId")) for c in chunks if c.get("type") in ANSWERED)


def asks_again(chunk: Chunk, answered: frozenset[str]) -> bool:
    """A replayed `tool-input-available` of a client call that has its outcome: the SDK
    calls `onToolCall` for every one it reads, so a resume (which replays the run from
    its start) ran the frontend's tool a second time. Left out of a replay, the part is
    still rebuilt whole from its input chunks and its output."""
    return chunk.get("type") == "tool-input-available" and not chunk.get("providerExecuted") \
        and str(chunk.get("toolCallId")) in answered
