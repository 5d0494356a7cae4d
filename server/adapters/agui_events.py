"""cowrite events -> AG-UI events, for one run streamed to one AG-UI thread.

The mapping the module docstring of `agui.py` describes: text messages, tool calls
(a client call ends the response with `RUN_FINISHED` `outcome: success` and its
`pendingToolCallIds`; an approval with `outcome: interrupt`), server tools' results,
and the run's end (`outcome: cancelled` for a cancelled or aborted run, `RUN_ERROR`
for a failed one, or when the link to the document was lost). A message discarded
(the run moved to another instance mid-text) is ended and then taken back by a
`MESSAGES_SNAPSHOT` (agui_mirror).
"""

from typing import Any

import orjson
from ag_ui.core import (
    BaseEvent,
    Interrupt,
    RunErrorEvent,
    RunFinishedCancelledOutcome,
    RunFinishedEvent,
    RunFinishedInterruptOutcome,
    RunFinishedSuccessOutcome,
    RunStartedEvent,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
    ToolCallArgsEvent,
    ToolCallEndEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
)

from protocol.server import (
    ApprovalRequested,
    MessageDelta,
    MessageDiscarded,
    MessageDone,
    RunFinished,
    ServerEvent,
    ToolCall,
    ToolDone,
)
from server.adapters.agui_mirror import discarded_marker


class AguiTranslator:
    """cowrite events -> AG-UI events for one run; `ids` = (threadId, runId) of the
    request being answered, changed by each continuing request."""

    def __init__(self, thread_id: str, run_id: str) -> None:
        self.ids = (thread_id, run_id)
        self.open_texts: list[str] = []
        self.texts: set[str] = set()  # messages whose text was sent: a discard takes it back
        self.client_calls: set[str] = set()
        self.started_calls: set[str] = set()  # TOOL_CALL_START sent: a result may follow

    def opening(self) -> list[BaseEvent]:
        return [RunStartedEvent(thread_id=self.ids[0], run_id=self.ids[1])]

    def _close_texts(self) -> list[BaseEvent]:
        events: list[BaseEvent] = [TextMessageEndEvent(message_id=m) for m in self.open_texts]
        self.open_texts = []
        return events

    def translate(self, event: ServerEvent, ours: bool) -> tuple[list[BaseEvent], bool]:
        thread_id, run_id = self.ids
        if isinstance(event, MessageDelta):
            events: list[BaseEvent] = []
            if event.message_id not in self.open_texts:
                self.open_texts.append(event.message_id)
                self.texts.add(event.message_id)
                events.append(TextMessageStartEvent(message_id=event.message_id,
                                                    role="assistant"))
            if event.delta:
                events.append(TextMessageContentEvent(message_id=event.message_id,
                                                      delta=event.delta))
            return events, False
        if isinstance(event, MessageDone):
            if event.message_id in self.open_texts:
                self.open_texts.remove(event.message_id)
                return [TextMessageEndEvent(message_id=event.message_id)], False
            if not event.text:
                return [], False
            self.texts.add(event.message_id)
            return [TextMessageStartEvent(message_id=event.message_id, role="assistant"),
                    TextMessageContentEvent(message_id=event.message_id, delta=event.text),
                    TextMessageEndEvent(message_id=event.message_id)], False
        if isinstance(event, MessageDiscarded):  # its model call is made again: the text
            # streamed so far is ended, then taken back by each response's own
            # MESSAGES_SNAPSHOT (agui_mirror: the list depends on the request's messages)
            if event.message_id not in self.texts:
                return [], False
            self.texts.discard(event.message_id)
            ended: list[BaseEvent] = []
            if event.message_id in self.open_texts:
                self.open_texts.remove(event.message_id)
                ended.append(TextMessageEndEvent(message_id=event.message_id))
            return [*ended, discarded_marker(event.message_id)], False
        if isinstance(event, ToolCall):
            self.started_calls.add(event.call_id)
            events = [*self._close_texts(), *_call(event.call_id, event.name, event.arguments)]
            if not ours:
                return events, False
            self.client_calls.add(event.call_id)
            return [*events, RunFinishedEvent(thread_id=thread_id, run_id=run_id,
                                              outcome=RunFinishedSuccessOutcome(
                                                  pending_tool_call_ids=[event.call_id]))], True
        if isinstance(event, ApprovalRequested):
            interrupt = Interrupt(id=event.call_id, reason="tool_approval",
                                  tool_call_id=event.call_id,
                                  message=f"approve {event.name}?",
                                  metadata={"name": event.name, "arguments": event.arguments})
            return [*self._close_texts(), RunFinishedEvent(
                thread_id=thread_id, run_id=run_id,
                outcome=RunFinishedInterruptOutcome(interrupts=[interrupt]))], True
        if isinstance(event, ToolDone) and event.call_id in self.started_calls \
                and event.call_id not in self.client_calls:  # not a rejected approval's call:
            # its TOOL_CALL_RESULT named a call never started, left dangling in the agent
            content = event.output if event.status == "ok" else {"status": event.status,
                                                                 "error": event.error}
            return [ToolCallResultEvent(message_id=f"{event.call_id}:result",
                                        tool_call_id=event.call_id, role="tool",
                                        content=orjson.dumps(content).decode())], False
        if isinstance(event, RunFinished):
            events = self._close_texts()
            if event.status == "completed":
                return [*events, RunFinishedEvent(thread_id=thread_id, run_id=run_id)], True
            if event.status in ("cancelled", "aborted"):  # stopped, not failed (AG-UI 1.0)
                return [*events, RunFinishedEvent(
                    thread_id=thread_id, run_id=run_id, outcome=RunFinishedCancelledOutcome(),
                    metadata={"cowrite": {"status": event.status, "reason": event.reason}})
                ], True
            code = event.status + (f":{event.reason}" if event.reason else "")
            message = f"run {event.status}" + (f": {event.error.message}" if event.error else
                                               f" ({event.reason})" if event.reason else "")
            return [*events, RunErrorEvent(message=message, code=code)], True
        return [], False


    def lost(self, message: str) -> list[BaseEvent]:
        """The link was lost mid-response: `RUN_ERROR` (the cowrite run goes on; the
        thread's next input answering its pending call adopts it again)."""
        return [*self._close_texts(), RunErrorEvent(message=message, code="connection_lost")]


def _call(call_id: str, name: str, arguments: dict[str, Any]) -> list[BaseEvent]:
    return [ToolCallStartEvent(tool_call_id=call_id, tool_call_name=name),
            ToolCallArgsEvent(tool_call_id=call_id, delta=orjson.dumps(arguments).decode()),
            ToolCallEndEvent(tool_call_id=call_id)]
