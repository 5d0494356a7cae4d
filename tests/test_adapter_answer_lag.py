"""An AI SDK answer posted through an instance that has not yet received the call it
answers. Another instance's events reach this one by pub/sub a few ms after they are
logged; the frontend, which saw the call through the other instance, posts its output
right away (a load balancer may send it anywhere). That instance's view of the chat had
no such pending call and refused the answer 409 `call_not_pending` (seen once in CI, in
tests/test_adapters_cluster.py, on a loaded host). It now catches up with the log first.
Two in-process servers on one real redis-server; the second's pub/sub delivery of the
`tool.call` is held back 1.5 s."""

import asyncio
from typing import Any

import httpx
import pytest

from server.backends.base import LoggedEvent
from tests.adapter_support import sse, user_message
from tests.harness import running_server
from tests.redis_support import redis_process
from tests.runs import READ, REPLACE_DOC, call, script

pytestmark = [pytest.mark.redis]
PROMPT = script({"tool_calls": [call("read_document")]},
                {"tool_calls": [call("replace_document", text="New")]},
                {"tool_calls": [call("read_document")]}, {"say": "Done."})
CHAT = "/v1/ai-sdk/lag/chat"
REPLACE = {**REPLACE_DOC, "requires_approval": False}


def _calls(chunks: list[Any]) -> list[dict[str, Any]]:
    return [c for c in chunks if isinstance(c, dict) and c["type"] == "tool-input-available"]


def _answered(call: dict[str, Any], output: Any) -> dict[str, Any]:
    return {"type": f"tool-{call['toolName']}", "toolCallId": call["toolCallId"],
            "state": "output-available", "input": call["input"], "output": output}


async def test_an_answer_to_a_call_this_instance_has_not_seen_yet_is_taken() -> None:
    async with redis_process() as redis, running_server(redis_url=redis.url) as one, \
            running_server(redis_url=redis.url) as two, httpx.AsyncClient(timeout=15) as http:
        async def post(server: Any, *parts: dict[str, Any]) -> list[Any]:
            messages = [user_message(PROMPT)]
            if parts:
                messages.append({"id": message_id, "role": "assistant", "parts": list(parts)})
            status, chunks = await sse(http, "POST", f"{server.http}{CHAT}", {
                "id": "chat", "messages": messages, "tools": [READ, REPLACE]})
            assert status == 200, chunks
            return chunks

        message_id = ""
        first = await post(one)
        message_id = first[0]["messageId"]
        read = _answered(_calls(first)[-1], {"text": "hi"})
        second = await post(two, read)  # `two` follows the chat from here on
        replace = _answered(_calls(second)[-1], {"ok": True})
        backend: Any = two.services.backend
        deliver, held = backend._deliver, list[asyncio.TimerHandle]()

        def late(document_id: str, epoch: str | None, event: LoggedEvent) -> None:
            if event.type == "tool.call" and not held:  # the third call, asked via `one`
                held.append(asyncio.get_running_loop().call_later(
                    1.5, deliver, document_id, epoch, event))
                return
            deliver(document_id, epoch, event)

        backend._deliver = late
        third = await post(one, read, replace)
        again = _answered(_calls(third)[-1], {"text": "hi"})
        assert held, "the third call reached `two` in time: nothing was tested"
        last = await post(two, read, replace, again)  # 409 call_not_pending, `two` late
        assert last[-2] == {"type": "finish", "finishReason": "stop"}
