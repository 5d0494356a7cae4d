"""A queued run that cannot start (PROTOCOL.md section 12) ends `failed` with `steps: 0`;
until that `run.finished` is logged it keeps the document. It used to free the
document first and log its end in the background: another instance's stalled-queue
pass (any tick of its janitor) could start the next queued run in between, and
clients saw the next run's `run.started` before the failed one's `run.finished`.

Which of the two comes first on another instance is a race, so this checks the order
of the two steps on the instance itself (real redis-server, server in this process):
when the failed run lets the document go, its `run.finished` is in the log already.
Its start is made to fail where an outage would make it fail: its record cannot be
written (`unavailable`).
"""

import asyncio
from typing import Any

import pytest

from server.backends.base import BackendUnavailable
from tests.harness import joined, running_server
from tests.redis_support import redis_process
from tests.runs import call, script, start

pytestmark = pytest.mark.redis


def _ended(run_id: str) -> Any:
    return lambda e: e.get("type") == "run.finished" and e.get("run_id") == run_id


@pytest.mark.parametrize("why", ["start_failed", "edited_while_queued"])
async def test_a_queued_run_that_cannot_start_logs_its_end_before_it_frees_the_document(
        monkeypatch: pytest.MonkeyPatch, why: str) -> None:
    async with redis_process() as redis, \
            running_server(redis_url=redis.url, run_lease_s=5.0) as server, \
            joined(server) as (alice, _), joined(server, sub="bob", client_id="b") as (bob, _):
        backend = server.services.backend
        ended_when_freed: list[bool] = []
        freed = asyncio.Event()
        put_run_record, release_run = backend.put_run_record, backend.release_run

        async def failing_record(document_id: str, run_id: str, record: dict[str, Any]
                                 ) -> None:
            if run_id == "q-1" and record.get("status") == "running":
                raise BackendUnavailable("the queued run's start fails here")
            await put_run_record(document_id, run_id, record)

        async def noting_release(document_id: str, run_id: str, owner: str) -> None:
            if run_id == "q-1":
                head = await backend.head(document_id)
                logged = await backend.read_after(document_id, head.epoch, 0)
                assert isinstance(logged, list)
                ended_when_freed.append(any(
                    e.type == "run.finished" and '"run_id":"q-1"' in e.frame for e in logged))
                freed.set()
            await release_run(document_id, run_id, owner)

        monkeypatch.setattr(backend, "put_run_record", failing_record)
        monkeypatch.setattr(backend, "release_run", noting_release)
        await start(alice, script({"tool_calls": [call("read_document")]}, {"say": "x"}),
                    run_id="r-1")
        await alice.recv_until("tool.call")
        await bob.send({"type": "run.start", "id": "q", "run_id": "q-1",
                        "prompt": script({"say": "queued"}), "tools": [],
                        "options": {"if_busy": "enqueue"}})
        assert (await bob.recv_until(lambda e: e.get("reply_to") == "q"))["status"] == "queued"
        if why == "edited_while_queued":  # a person's edit ends both (on_edit: abort)
            await alice.send({"type": "editor.change", "document_version": 2})
        else:
            await alice.send({"type": "run.cancel", "id": "c", "run_id": "r-1"})
        await alice.recv_until(_ended("r-1"))
        finished = await bob.recv_until(_ended("q-1"), timeout=10)
        expected = ("failed", "unavailable") if why == "start_failed" else \
            ("aborted", "document_changed")
        assert (finished["status"], finished["reason"]) == expected, finished
        await asyncio.wait_for(freed.wait(), 10)  # freed right after its end
        assert ended_when_freed == [True]  # was [False]: freed before its end was logged
