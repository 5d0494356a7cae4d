"""A queued run ended before it started (here: a person's edit while it waited) holds
its claim until its `run.finished` is logged. If that end cannot be written for longer
than a lease (an outage), the claim's lease lapses and a janitor ends the run itself
(`server_lost`); the retried end was then logged too: two `run.finished` for one run,
the next queued run's end between them. The end is now written with a renewal of the
claim's lease, refused once another holds it. Found by a review; the end's writes are
made to fail for 2.5 s (leases of 1 s), as an outage would, the janitor's go through."""

import time
from collections.abc import Callable
from typing import Any

import pytest

from server.backends.base import BackendUnavailable
from tests.harness import joined, running_server
from tests.redis_support import redis_process
from tests.runs import call, script, start

pytestmark = pytest.mark.redis


def _reply_to(message_id: str) -> Callable[[dict[str, Any]], bool]:
    return lambda e: e.get("reply_to") == message_id


async def test_one_run_finished_for_a_queued_run_whose_end_is_slow_to_log(
        monkeypatch: pytest.MonkeyPatch) -> None:
    async with redis_process() as redis, \
            running_server(redis_url=redis.url, run_lease_s=1.0) as server, \
            joined(server) as (alice, _), joined(server, sub="bob", client_id="b") as (bob, _):
        backend = server.services.backend
        append = backend.append_once
        outage_until: list[float] = []

        async def failing_append(document_id: str, event: dict[str, Any], write_id: str
                                 ) -> Any:
            if event.get("type") == "run.finished" and event.get("run_id") == "q-1" and \
                    not write_id.startswith("orphan:"):  # the janitor's goes through
                if not outage_until:
                    outage_until.append(time.monotonic() + 2.5)
                if time.monotonic() < outage_until[0]:
                    raise BackendUnavailable("outage (simulated for this append)")
            return await append(document_id, event, write_id)

        renew_and_append = backend.renew_and_append

        async def failing_renew_and_append(document_id: str, record: dict[str, Any],
                                           lease_s: float, parts: Any, events: Any) -> Any:
            if any(e.get("type") == "run.finished" and e.get("run_id") == "q-1"
                   for e in events):
                if not outage_until:
                    outage_until.append(time.monotonic() + 2.5)
                if time.monotonic() < outage_until[0]:
                    raise BackendUnavailable("outage (simulated for this append)")
            return await renew_and_append(document_id, record, lease_s, parts, events)

        monkeypatch.setattr(backend, "append_once", failing_append)
        monkeypatch.setattr(backend, "renew_and_append", failing_renew_and_append)
        await start(alice, script({"tool_calls": [call("read_document")]}, {"say": "x"}),
                    run_id="r-1")
        await alice.recv_until("tool.call")
        for n in ("q1", "q2"):
            await bob.send({"type": "run.start", "id": n, "run_id": f"q-{n[1]}",
                            "prompt": script({"say": "queued"}), "tools": [],
                            "options": {"if_busy": "enqueue"}})
            reply = await bob.recv_until(_reply_to(n))
            assert reply["status"] == "queued", reply
        await alice.send({"type": "editor.change", "document_version": 2})  # ends r-1, q-1
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            try:
                await bob.recv(timeout=max(0.05, deadline - time.monotonic()))
            except TimeoutError:
                break
        seen = [(e["type"], e.get("run_id"), e.get("status"), e.get("reason"))
                for e in bob.events if e.get("type") in ("run.finished", "run.started")
                and e.get("run_id") in ("q-1", "q-2")]
        ends = [s for s in seen if s[0] == "run.finished" and s[1] == "q-1"]
        assert len(ends) == 1, seen
        assert outage_until, "the end's write never met the outage"
