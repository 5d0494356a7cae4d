"""How a takeover tells whether the model call it makes again had sent text
(`server.agent.takeover.message_streamed`, PROTOCOL.md section 13): read back
from the log's head to the event the call followed, however far that is. On the
memory log, which keeps the `read_after` contract the Redis log keeps
(tests/test_backend_contract.py); the whole story with real instances and
redis-server is tests/test_takeover_far_text.py."""

from typing import Any

import pytest

from protocol.server import (
    DocumentChanged,
    DurableEvent,
    MessageDelta,
    MessageDiscarded,
    RunResumed,
    RunStarted,
    ToolDone,
)
from server.agent.takeover import STREAMED_PAGE, message_streamed
from server.backends.memory import MemoryBackend

EDITED = DocumentChanged(document_version=1, user_id="bob", client_id="b", origin="user")
STARTED = RunStarted(run_id="r", mode="agent", user_id="alice", client_id="a", prompt="p")


def delta(message_id: str, run_id: str = "r") -> MessageDelta:
    return MessageDelta(run_id=run_id, message_id=message_id, delta="text")


async def streamed(events: list[DurableEvent], message_id: str,
                   log_max_events: int = 100_000) -> bool:
    backend = MemoryBackend(log_max_events)
    for event in events:
        await backend.append("doc", event.to_wire())
    return await message_streamed(backend, "doc", "r", message_id)


MANY = [EDITED] * (2 * STREAMED_PAGE + 17)  # more than a page: the read goes on back


@pytest.mark.parametrize(("events", "message_id", "expected"), [
    ([STARTED, delta("r:m1"), *MANY], "r:m1", True),
    ([STARTED, *MANY], "r:m1", False),  # the call sent nothing: read back to its start
    ([STARTED, delta("r:m1", run_id="other"), *MANY], "r:m1", False),  # another run's
    # The call after a tool: the deltas of the run's earlier message are not its own.
    ([STARTED, delta("r:m1"), ToolDone(run_id="r", call_id="c", status="ok"), *MANY],
     "r:m2", False),
    # Taken over before: the message the resumed call opened had sent nothing yet.
    ([STARTED, delta("r:m1"), RunResumed(run_id="r", step=1, reason="owner_lost"),
      MessageDiscarded(run_id="r", message_id="r:m1"), *MANY], "r:m1.r1", False),
    ([], "r:m1", True),  # the run's start is not in this log: said discarded, harmless
], ids=["far-text", "no-text", "other-run", "after-a-tool", "after-a-takeover", "empty"])
async def test_message_streamed_reads_back_to_the_call(events: list[Any], message_id: str,
                                                       expected: bool) -> None:
    assert await streamed(events, message_id) is expected


async def test_a_log_trimmed_past_the_call_s_start_counts_as_text_sent() -> None:
    assert await streamed([STARTED, *MANY], "r:m1", log_max_events=STREAMED_PAGE) is True
