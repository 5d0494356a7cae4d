"""The text of a run handed over mid-message, as a live AG-UI frontend holds it.

A drain (SIGTERM) of the run's owner hands the run over; the survivor makes the
model call that was streaming again under a new message id, after
`message.discarded`. AG-UI has no event that removes one message, so a frontend
following live kept the interrupted text beside the whole answer. Now the
response ends the interrupted message and sends a `MESSAGES_SNAPSHOT` of the
frontend's messages without it (`server/adapters/agui_mirror.py`); the real
`@ag-ui/client` agent then holds the answer once and everything else it held.
"""

import asyncio
from typing import Any

import httpx
import pytest
from ag_ui.core import (
    AssistantMessage,
    CustomEvent,
    FunctionCall,
    MessagesSnapshotEvent,
    TextMessageContentEvent,
    TextMessageStartEvent,
    ToolCall,
    ToolCallArgsEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
    UserMessage,
)

from server.adapters.agui_mirror import MessageMirror, discarded_marker
from server.lifecycle import drain
from tests.adapter_support import node_json, sse
from tests.harness import joined, running_server
from tests.redis_support import redis_process
from tests.runs import READ, call, script

ANSWER = "".join(chr(65 + i % 26) for i in range(60))
RENDER = """
import { AbstractAgent } from "@ag-ui/client";
import { Observable } from "rxjs";
class Recorded extends AbstractAgent {
  constructor(events, messages) { super({ threadId: "t", initialMessages: messages });
                                  this.events = events; }
  run() { return new Observable((s) => { this.events.forEach((e) => s.next(e)); s.complete(); }); }
}
const out = [];
for (const { messages, events } of JSON.parse(await new Response(process.stdin).text())) {
  const agent = new Recorded(events, messages);
  await agent.runAgent();
  out.push(agent.messages);
}
console.log(JSON.stringify(out));
"""


def held(responses: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The messages the real `@ag-ui/client` agent holds after each response's events,
    starting from the messages its request sent."""
    return list(node_json(RENDER, responses, "@ag-ui/client"))


def _texts(messages: list[dict[str, Any]]) -> list[str]:
    return [m["content"] for m in messages if m["role"] == "assistant" and m.get("content")]


@pytest.mark.redis
async def test_agui_live_response_shows_a_handed_over_answer_once() -> None:
    prompt = script({"tool_calls": [call("read_document")]}, {"say": ANSWER},
                    chunk_chars=1, delay_ms=40)
    base = {"threadId": "t1", "state": {}, "context": [], "forwardedProps": {},
            "tools": [{"name": "read_document", "description": "Read.",
                       "parameters": READ["parameters"]}]}
    user = {"id": "u1", "role": "user", "content": prompt}
    async with redis_process() as redis, running_server(redis_url=redis.url) as one, \
            running_server(redis_url=redis.url) as two, \
            joined(two, "moved", sub="bob", client_id="watcher") as (watcher, _), \
            httpx.AsyncClient(timeout=30) as http:
        status, first = await sse(http, "POST", f"{one.http}/v1/agui/moved",
                                  {**base, "runId": "r1", "messages": [user]})
        assert status == 200 and first[-1]["type"] == "RUN_FINISHED"
        [after_first] = held([{"messages": [user], "events": first}])
        call_id = first[-1]["outcome"]["pendingToolCallIds"][0]
        answer_messages = [*after_first, {"id": "t-1", "role": "tool", "toolCallId": call_id,
                                          "content": '{"text": "doc"}'}]
        # The answer goes through `two`, which streams the rest while `one` runs it.
        rest = asyncio.create_task(sse(http, "POST", f"{two.http}/v1/agui/moved", {
            **base, "runId": "r2", "messages": answer_messages}))
        for _ in range(8):
            await watcher.recv_until("message.delta")
        await drain(one.services, timeout_s=5.0)  # SIGTERM: the run moves to `two`
        gone = (await watcher.recv_until("message.discarded", timeout=15))["message_id"]
        assert (await watcher.recv_until("message.done", timeout=15))["text"] == ANSWER
        status, events = await asyncio.wait_for(rest, 30)
        assert status == 200 and events[-1]["type"] == "RUN_FINISHED"
        [final] = held([{"messages": answer_messages, "events": events}])
        assert _texts(final) == [ANSWER]  # shown once (it was [interrupted part, ANSWER])
        kinds = [(e["type"], e.get("messageId")) for e in events]
        assert ("TEXT_MESSAGE_CONTENT", gone) in kinds  # the interrupted text went live
        ended = kinds.index(("TEXT_MESSAGE_END", gone))
        assert kinds[ended + 1] == ("MESSAGES_SNAPSHOT", None)
        assert [m["id"] for m in final[:len(answer_messages)]] == \
            [m["id"] for m in answer_messages]  # nothing else the frontend held is lost
        assert gone not in [m["id"] for m in final]


def test_the_mirror_follows_the_reducer_and_takes_back_only_the_discarded_message() -> None:
    """What `MessageMirror` sends for a discarded message: every message the frontend
    holds (the request's, this response's text, tool calls and results) but that one;
    nothing for a message this response never showed."""
    mirror = MessageMirror([UserMessage(id="u", role="user", content="hi")])
    for event in (TextMessageStartEvent(message_id="a", role="assistant"),
                  TextMessageContentEvent(message_id="a", delta="Sure"),
                  ToolCallStartEvent(tool_call_id="c", tool_call_name="t"),
                  ToolCallArgsEvent(tool_call_id="c", delta='{"x": 1}'),
                  ToolCallResultEvent(message_id="c:r", tool_call_id="c", content="ok"),
                  TextMessageStartEvent(message_id="m", role="assistant"),
                  TextMessageContentEvent(message_id="m", delta="Hal")):
        assert mirror.apply(event) is event
    snapshot = mirror.apply(discarded_marker("m"))
    assert isinstance(snapshot, MessagesSnapshotEvent)
    assert [m.id for m in snapshot.messages] == ["u", "a", "c", "c:r"]
    assert snapshot.messages[1].content == "Sure"
    assert snapshot.messages[2] == AssistantMessage(
        id="c", role="assistant", tool_calls=[ToolCall(
            id="c", type="function", function=FunctionCall(name="t", arguments='{"x": 1}'))])
    assert mirror.apply(discarded_marker("m")) is None  # once
    assert mirror.apply(discarded_marker("never-shown")) is None
    other = CustomEvent(name="something", value=1)
    assert mirror.apply(other) is other
