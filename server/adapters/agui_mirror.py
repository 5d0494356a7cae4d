"""The messages an AG-UI frontend holds while one response streams, to take one back.

AG-UI has no event that removes one message; `MESSAGES_SNAPSHOT` replaces the
frontend's list (`@ag-ui/client` keeps the messages the snapshot names, drops
the others, and appends the new ones). So when a run moves to another instance
mid-text and its model call is made again (`message.discarded`), the response
sends the list the frontend holds without the discarded message: the request's
own `messages` (the frontend sends its whole history, activity messages aside,
which a snapshot without any leaves alone) plus what this response has streamed,
applied the way `@ag-ui/client`'s default reducer applies it. Pure: no I/O.
"""

from ag_ui.core import (
    AssistantMessage,
    BaseEvent,
    CustomEvent,
    FunctionCall,
    Message,
    MessagesSnapshotEvent,
    TextMessageContentEvent,
    TextMessageStartEvent,
    ToolCall,
    ToolCallArgsEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
    ToolMessage,
)

DISCARDED = "cowrite.message_discarded"
"""The name of the `CUSTOM` item the translator keeps for a discarded message (its id
as the value): each response turns it into its own `MESSAGES_SNAPSHOT` (`MessageMirror`),
since the list depends on the request the response answers."""


def discarded_marker(message_id: str) -> CustomEvent:
    return CustomEvent(name=DISCARDED, value=message_id)


class MessageMirror:
    """The frontend's messages as one response's events change them. Streaming only
    keeps the events (a reference each: no work per delta); the list is built when a
    discarded message asks for it, which is rare."""

    def __init__(self, messages: list[Message]) -> None:
        self._base = messages
        self._events: list[BaseEvent] = []

    def apply(self, event: BaseEvent) -> BaseEvent | None:
        """`event` as the response sends it (a discarded marker becomes the snapshot
        without that message); None: nothing to send."""
        if not (isinstance(event, CustomEvent) and event.name == DISCARDED):
            self._events.append(event)
            return event
        messages = _Reduced(self._base, self._events).messages
        self._events = []
        gone = str(event.value)
        if not any(m.id == gone for m in messages):
            self._base = messages
            return None
        self._base = [m for m in messages if m.id != gone]
        return MessagesSnapshotEvent(messages=self._base)


class _Reduced:
    """`messages` after `events`, as `@ag-ui/client`'s default reducer applies them
    (text and tool arguments joined once, not per delta)."""

    def __init__(self, base: list[Message], events: list[BaseEvent]) -> None:
        self.messages: list[Message] = [m.model_copy(deep=True) for m in base]
        self._index: dict[str, Message] = {m.id: m for m in self.messages}
        self._calls: dict[str, ToolCall] = {}
        for message in self.messages:
            if isinstance(message, AssistantMessage):
                self._calls.update((call.id, call) for call in message.tool_calls or ())
        texts: dict[str, list[str]] = {}
        arguments: dict[str, list[str]] = {}
        for event in events:
            if isinstance(event, TextMessageStartEvent):
                if event.message_id not in self._index:
                    self._add(AssistantMessage(id=event.message_id, role="assistant",
                                               content=""))
            elif isinstance(event, TextMessageContentEvent):
                if isinstance(self._index.get(event.message_id), AssistantMessage):
                    texts.setdefault(event.message_id, []).append(event.delta)
            elif isinstance(event, ToolCallStartEvent):
                self._start_call(event)
            elif isinstance(event, ToolCallArgsEvent):
                if event.tool_call_id in self._calls:
                    arguments.setdefault(event.tool_call_id, []).append(event.delta)
            elif isinstance(event, ToolCallResultEvent):
                self._add_result(event)
        for message_id, parts in texts.items():
            message = self._index[message_id]
            assert isinstance(message, AssistantMessage)
            message.content = (message.content or "") + "".join(parts)
        for call_id, parts in arguments.items():
            self._calls[call_id].function.arguments += "".join(parts)

    def _add(self, message: Message) -> None:
        self.messages.append(message)
        self._index.setdefault(message.id, message)

    def _holder(self, call_id: str) -> AssistantMessage | None:
        for message in self.messages:
            if isinstance(message, AssistantMessage) and \
                    any(call.id == call_id for call in message.tool_calls or ()):
                return message
        return None

    def _start_call(self, event: ToolCallStartEvent) -> None:
        if event.tool_call_id in self._calls:
            return
        named = event.parent_message_id
        parent = self._index.get(named) if named else None
        if not isinstance(parent, AssistantMessage):  # the reducer's rule: a new message,
            # named as the event says unless that id is another kind of message's
            parent = AssistantMessage(id=named if named and parent is None else
                                      event.tool_call_id, role="assistant", tool_calls=[])
            self._add(parent)
        call = ToolCall(id=event.tool_call_id, type="function",
                        function=FunctionCall(name=event.tool_call_name, arguments=""))
        parent.tool_calls = [*(parent.tool_calls or ()), call]
        self._calls[call.id] = call

    def _add_result(self, event: ToolCallResultEvent) -> None:
        result = ToolMessage(id=event.message_id, role="tool", content=event.content,
                             tool_call_id=event.tool_call_id)
        holder = self._holder(event.tool_call_id)
        if holder is None:
            self._add(result)
            return
        index = self.messages.index(holder) + 1
        while index < len(self.messages) and self.messages[index].role == "tool":
            index += 1
        self.messages.insert(index, result)
        self._index.setdefault(result.id, result)


__all__ = ["DISCARDED", "MessageMirror", "discarded_marker"]
