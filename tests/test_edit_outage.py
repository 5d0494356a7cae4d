"""A person's edit of a run owned by another instance while Redis is away for the
instance the person is connected to (PROTOCOL.md sections 11 and 13).

That instance looks up the run's owner before it forwards the edit. The lookup
failed, and the edit was dropped there without a word: the run was not stopped
(`on_edit: abort`), and when Redis came back before the edit's `document.changed`
was logged, the sender even got an `ack`. Now the lookup is tried again for up to
2 s (a blip is bridged: the edit reaches the run), then the edit is refused
`unavailable` with `retry_after_ms` before anything is done or broadcast.

The owner is a `python -m server` subprocess on the real redis-server; the person's
instance runs in this process behind a proxy that takes Redis away at the lookup.
"""

from collections.abc import Callable
from typing import Any

import pytest

from tests.cluster_support import instance, join
from tests.harness import joined, running_server
from tests.redis_support import redis_process
from tests.runs import call, script, start
from tests.test_outage_gaps import OutageProxy

pytestmark = [pytest.mark.redis, pytest.mark.slow]

LOOKUP = b"$3\r\nGET\r\n$17\r\ncw:{doc-1}:active\r\n"  # `active_run("doc-1")`
LEASE_S = 6.0  # the lookup is tried again for 2 s (half a lease would be 3)


def _reply_to(message_id: str) -> Callable[[dict[str, Any]], bool]:
    return lambda e: e.get("reply_to") == message_id


async def _edit_during_outage(outage_s: float
                              ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Bob's edit while his instance's Redis is away for `outage_s` from the lookup on:
    its reply, and then the events Bob saw."""
    async with redis_process() as redis, \
            OutageProxy(redis.port, LOOKUP, outage_s=outage_s, forward=False) as proxy, \
            instance(redis, {"COWRITE_RUN_LEASE_S": str(LEASE_S)}) as owner, \
            running_server(redis_url=proxy.url, run_lease_s=LEASE_S) as typist, \
            join(owner) as (alice, _), joined(typist, sub="bob", client_id="b") as (bob, _):
        await start(alice, script({"tool_calls": [call("read_document")]}, {"say": "x"}),
                    run_id="r-1")
        await bob.recv_until(lambda e: e.get("type") == "tool.call")
        proxy.armed = True
        await bob.send({"type": "editor.change", "id": "e", "document_version": 2})
        reply = await bob.recv_until(_reply_to("e"), timeout=20)
        assert proxy.fired.is_set()
        if reply["type"] == "ack":
            await bob.recv_until(lambda e: e.get("type") == "run.finished", timeout=20)
        return reply, bob.events


async def test_an_edit_sent_during_a_redis_blip_stops_the_run_elsewhere() -> None:
    reply, events = await _edit_during_outage(1.0)
    assert reply["type"] == "ack", reply  # was `unavailable`, the run not told
    changed = [e for e in events if e.get("type") == "document.changed"]
    assert [e["document_version"] for e in changed] == [2]
    finished = [e for e in events if e.get("type") == "run.finished"]
    assert [(e["status"], e["reason"]) for e in finished] == [("aborted", "document_changed")]


async def test_an_edit_sent_during_a_longer_outage_is_refused_before_anything_is_done(
        ) -> None:
    reply, events = await _edit_during_outage(8.0)
    assert (reply["type"], reply["code"]) == ("error", "unavailable"), reply
    assert reply["retry_after_ms"] > 0
    assert not [e for e in events if e.get("type") in ("document.changed", "run.finished")]
