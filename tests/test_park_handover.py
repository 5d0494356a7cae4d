"""An edit left by a shutting-down instance for the next owner of the run it handed
over (`Lanes._park`, PROTOCOL.md section 13), against a real redis-server.

The edit goes into the old owner's own inbox, which the successor replays once it
holds the run's lease. Checked ("nobody holds the run") and sent in two steps, a
successor could take the run and replay that inbox in between: the edit, counted as
handed on, was never read. The takeover is made to fall right after `_park`'s first
Redis call, which is where the two-step version left its window open.
"""

from collections.abc import AsyncIterator
from typing import Any

import pytest

from server.agent.lanes import Lanes
from server.backends.base import Backend
from server.backends.memory import MemoryBackend
from server.backends.redis import RedisBackend
from tests.redis_support import redis_process

pytestmark = pytest.mark.redis

DOC, RUN, OLD, NEXT = "doc-p", "r-park", "old-owner", "successor"
EDIT = {"kind": "edit", "document_id": DOC, "run_id": RUN, "user_id": "bob",
        "message": {"type": "editor.change", "document_version": 2, "changes": []}}


class _TakeoverAfterFirstCall:
    """The backend, with a successor's takeover (claim the lapsed lease, replay the old
    owner's inbox, as `JanitorMixin._go_on_with` does) run right after the first
    `send_to_run_owner` call once armed, before that call's answer reaches its caller."""

    def __init__(self, backend: RedisBackend) -> None:
        self._backend = backend
        self.armed = False
        self.replayed: list[dict[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    async def send_to_run_owner(self, *args: Any, **kwargs: Any) -> str | None:
        sent = await self._backend.send_to_run_owner(*args, **kwargs)
        if self.armed:
            self.armed = False
            taken = await self._backend.expired_runs(NEXT, 10)
            assert [(doc, record["owner"]) for doc, record in taken] == [(DOC, OLD)]
            self.replayed = [message for _, message in
                             await self._backend.unread_messages(OLD)]
        return sent


@pytest.fixture
async def redis_backend() -> AsyncIterator[RedisBackend]:
    async with redis_process() as proc:
        backend = RedisBackend(proc.url)
        await backend.start()
        try:
            yield backend
        finally:
            await backend.close()


async def _handed_over(backend: Backend) -> None:
    """`OLD` claimed the run and handed it over (draining): nobody holds it, its record
    still names `OLD`, its lease lapsed at once."""
    record = {"run_id": RUN, "status": "running", "owner": OLD}
    assert await backend.claim_run(DOC, record, 10) is None
    assert await backend.hand_off_run(DOC, {**record, "handoff": True})


async def test_an_edit_parked_during_a_takeover_reaches_the_successor(
        redis_backend: RedisBackend) -> None:
    await _handed_over(redis_backend)
    backend = _TakeoverAfterFirstCall(redis_backend)
    lanes = Lanes(backend, OLD, 10, lambda document_id, run_id: False)
    backend.armed = True
    assert await lanes._park(DOC, RUN, EDIT)
    assert not backend.armed  # the takeover did fall inside `_park`
    successor_saw = backend.replayed + [message for _, message in
                                        await redis_backend.unread_messages(NEXT)]
    assert successor_saw == [EDIT], (successor_saw,
                                     await redis_backend.unread_messages(OLD))


async def test_park_sends_to_the_callers_inbox_only_for_its_handed_over_run(
        redis_backend: RedisBackend) -> None:
    """The backend step itself: parked in the caller's inbox while nobody holds the run
    and its record names the caller; to the holder once one holds it; nothing for a
    run the record names another instance as owner of, or one not active."""
    await _handed_over(redis_backend)
    assert await redis_backend.send_to_run_owner(DOC, RUN, EDIT, not_to=OLD) == ""
    assert await redis_backend.unread_messages(OLD) == []
    assert await redis_backend.send_to_run_owner(DOC, RUN, EDIT, not_to="other",
                                                 park=True) == ""
    assert await redis_backend.send_to_run_owner(DOC, RUN, EDIT, not_to=OLD,
                                                 park=True) == OLD
    assert [m for _, m in await redis_backend.unread_messages(OLD)] == [EDIT]
    assert await redis_backend.send_to_run_owner(DOC, "gone", EDIT, not_to=OLD,
                                                 park=True) is None
    await redis_backend.expired_runs(NEXT, 10)
    assert await redis_backend.send_to_run_owner(DOC, RUN, EDIT, not_to=OLD,
                                                 park=True) == NEXT
    assert [m for _, m in await redis_backend.unread_messages(NEXT)] == [EDIT]


async def test_memory_backend_parks_as_redis_does() -> None:
    """One process: its runs are never handed over, but the option means the same."""
    backend = MemoryBackend()
    assert await backend.claim_run(DOC, {"run_id": RUN, "status": "running",
                                         "owner": OLD}, 10) is None
    assert await backend.send_to_run_owner(DOC, RUN, EDIT, not_to=OLD) == ""
    assert await backend.send_to_run_owner(DOC, RUN, EDIT, not_to="other", park=True) == OLD
    assert await backend.send_to_run_owner(DOC, RUN, EDIT, not_to=OLD, park=True) == OLD
    assert await backend.send_to_run_owner(DOC, "gone", EDIT, not_to=OLD, park=True) is None
