"""One contract, two backends: memory and Redis (a real redis-server)."""

import asyncio
from collections.abc import AsyncIterator

import pytest

from server.backends.base import (
    Backend,
    BackendUnavailable,
    LoggedEvent,
    RunParts,
    UnloggableEvent,
)
from server.backends.memory import MemoryBackend
from server.backends.redis import RedisBackend
from tests.redis_support import redis_process


@pytest.fixture(params=["memory", "redis"])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    if request.param == "memory":
        yield MemoryBackend(log_max_events=50)
        return
    async with redis_process() as proc:
        redis_backend = RedisBackend(proc.url, log_max_events=50)
        await redis_backend.start()
        try:
            yield redis_backend
        finally:
            await redis_backend.close()


async def test_append_numbers_gaplessly_and_delivers_in_order(backend: Backend) -> None:
    seen: list[LoggedEvent] = []
    await backend.subscribe("d", seen.append)
    logged = [await backend.append("d", {"type": "document.changed", "n": i}) for i in range(5)]
    assert [e.seq for e in logged] == [1, 2, 3, 4, 5]
    frame = logged[2].frame
    assert '"seq":3' in frame and '"ts":' in frame and '"n":2' in frame
    for _ in range(100):
        if len({e.seq for e in seen}) >= 5:
            break
        await asyncio.sleep(0.01)
    assert sorted({e.seq for e in seen}) == [1, 2, 3, 4, 5]
    head = await backend.head("d")
    assert head.last_seq == 5 and head.epoch
    assert (await backend.head("other")).epoch != head.epoch


async def test_append_once_logs_as_append_does(backend: Backend) -> None:
    """Under write ids (a shared log's retry looks them up, `test_redis_idempotent`), each
    id new: gapless seqs, interleaved with plain appends, content checked up front."""
    seen: list[LoggedEvent] = []
    await backend.subscribe("d", seen.append)
    first = await backend.append_once("d", {"type": "document.changed", "n": 0}, "w-0")
    plain = await backend.append("d", {"type": "document.changed", "n": 1})
    second = await backend.append_once("d", {"type": "document.changed", "n": 2}, "w-2")
    assert (first.seq, plain.seq, second.seq) == (1, 2, 3) and '"n":2' in second.frame
    with pytest.raises(UnloggableEvent):
        await backend.append_once("d", {"type": "tool.done", "output": {1, 2}}, "w-3")
    assert (await backend.head("d")).last_seq == 3
    for _ in range(100):
        if len({e.seq for e in seen}) >= 3:
            break
        await asyncio.sleep(0.01)
    assert sorted({e.seq for e in seen}) == [1, 2, 3]


async def test_read_after_and_resume_failures(backend: Backend) -> None:
    for i in range(120):
        await backend.append("d", {"type": "document.changed", "n": i})
    epoch, last = await backend.head("d")
    tail = await backend.read_after("d", epoch, last - 10)
    assert isinstance(tail, list) and [e.seq for e in tail] == list(range(last - 9, last + 1))
    window = await backend.read_after("d", epoch, last - 10, last - 5)
    assert isinstance(window, list) and [e.seq for e in window] == list(range(last - 9, last - 4))
    assert await backend.read_after("d", epoch, last) == []
    assert await backend.read_after("d", epoch, 1) == "history_truncated"  # kept >= 50, not 120
    assert await backend.read_after("d", epoch, last + 1) == "history_truncated"
    assert await backend.read_after("d", "stale-epoch", last - 1) == "epoch_changed"
    kept = await backend.read_after("d", epoch, last - 50)
    assert isinstance(kept, list) and len(kept) == 50  # at least COWRITE_LOG_MAX_EVENTS


async def test_history_and_run_records(backend: Backend) -> None:
    await backend.append_history("d", [{"role": "user", "content": "hi", "run_id": "r"}])
    await backend.append_history("d", [{"role": "assistant", "content": "yo", "run_id": "r"}])
    assert [m["content"] for m in await backend.read_history("d")] == ["hi", "yo"]
    assert await backend.read_history("empty") == []
    await backend.put_run_record("d", "r", {"status": "running"})
    await backend.put_run_record("d", "r", {"status": "completed"})
    assert await backend.get_run_record("d", "r") == {"status": "completed"}
    assert await backend.get_run_record("d", "nope") is None


async def test_claims_are_single_use(backend: Backend) -> None:
    results = await asyncio.gather(*(backend.claim_once("call:r:c", 60) for _ in range(10)))
    assert results.count(True) == 1
    assert await backend.claim_once("call:r:other", 60)


async def test_connection_and_run_limits(backend: Backend) -> None:
    assert await backend.acquire_connection("u", "c1", 2)
    assert await backend.acquire_connection("u", "c2", 2)
    assert not await backend.acquire_connection("u", "c3", 2)
    assert await backend.acquire_connection("v", "c4", 2)
    await backend.release_connection("u", "c1")
    assert await backend.acquire_connection("u", "c5", 2)
    assert await backend.acquire_connection("u", "c6", 0)  # 0 disables
    assert [await backend.take_run_slot("u", 3) for _ in range(3)] == [0, 0, 0]
    wait = await backend.take_run_slot("u", 3)
    assert 0 < wait <= 60_000
    assert await backend.take_run_slot("other", 3) == 0
    assert await backend.take_run_slot("u", 0) == 0


async def test_redis_outage_is_a_clear_error_and_recovers() -> None:
    async with redis_process() as proc:
        backend = RedisBackend(proc.url, op_timeout_s=0.5)
        await backend.start()
        try:
            seen: list[int] = []
            await backend.subscribe("d", lambda e: seen.append(e.seq))
            await backend.append("d", {"type": "document.changed"})
            await proc.stop()
            assert not await backend.ready()
            with pytest.raises(BackendUnavailable):
                await backend.append("d", {"type": "document.changed"})
            await proc.start()  # the AOF brings back what was accepted
            for _ in range(100):
                if await backend.ready():
                    break
                await asyncio.sleep(0.05)
            logged = await backend.append("d", {"type": "document.changed"})
            assert logged.seq == 2  # nothing accepted before the outage was lost
            events = await backend.read_after("d", (await backend.head("d")).epoch, 0)
            assert isinstance(events, list) and [e.seq for e in events] == [1, 2]
        finally:
            await backend.close()


async def test_an_unloggable_event_takes_no_seq(backend: Backend) -> None:
    """Issue 11: serialization fails before a seq is taken, in both backends."""
    from server.backends.base import UnloggableEvent

    deep: object = 1
    for _ in range(300):
        deep = [deep]
    await backend.append("d", {"type": "document.changed"})
    for bad in (deep, 2**64):
        with pytest.raises(UnloggableEvent):
            await backend.append("d", {"type": "tool.done", "output": bad})
    assert (await backend.append("d", {"type": "document.changed"})).seq == 2
    epoch, last = await backend.head("d")
    replay = await backend.read_after("d", epoch, 0)
    assert last == 2 and isinstance(replay, list) and [e.seq for e in replay] == [1, 2]


async def test_checkpoint_parts_go_with_the_owners_record_only(backend: Backend) -> None:
    record = {"run_id": "r1", "status": "running", "owner": "instance-1"}
    assert await backend.claim_run("doc-p", record, 10) is None
    assert await backend.renew_run("doc-p", record, 10, RunParts(("a", "b"), reset=True))
    assert await backend.renew_run("doc-p", record, 10, RunParts(("c",)))
    assert await backend.run_parts("doc-p") == ["a", "b", "c"]
    assert not await backend.renew_run("doc-p", {**record, "run_id": "r2"}, 10,
                                       RunParts(("x",)))  # not the active run: nothing
    assert await backend.renew_run("doc-p", record, 10, RunParts(("d",), reset=True))
    assert await backend.run_parts("doc-p") == ["d"]
    await backend.release_run("doc-p", "r1", "instance-1")
    assert await backend.run_parts("doc-p") == []


async def test_a_checkpoint_and_its_events_are_written_together_or_not_at_all(
        backend: Backend) -> None:
    """A decision's checkpoint and the events announcing it, in one step: an owner
    killed between two separate writes left a checkpoint whose events never came."""
    record = {"run_id": "r1", "status": "running", "owner": "instance-1"}
    assert await backend.claim_run("doc-w", record, 10) is None
    seen: list[LoggedEvent] = []
    await backend.subscribe("doc-w", seen.append)
    events = [{"type": "tool.done", "run_id": "r1", "call_id": "c1"},
              {"type": "tool.call", "run_id": "r1", "call_id": "c2"}]
    waiting = {**record, "status": "waiting_tool"}
    assert await backend.renew_and_append("doc-w", waiting, 10, RunParts(("a",), reset=True),
                                          events)
    assert (await backend.active_run("doc-w") or {}).get("status") == "waiting_tool"
    assert await backend.run_parts("doc-w") == ["a"]
    logged = await backend.read_after("doc-w", (await backend.head("doc-w")).epoch, 0)
    assert isinstance(logged, list) and [(e.seq, e.type) for e in logged] == [
        (1, "tool.done"), (2, "tool.call")]
    for _ in range(100):  # and fanned out, as appends are
        if len(seen) >= 2:
            break
        await asyncio.sleep(0.01)
    assert [e.seq for e in seen][:2] == [1, 2]
    # Not the active run (another took the document, or its lease went elsewhere):
    # neither the record, nor the parts, nor any event.
    refused = await backend.renew_and_append("doc-w", {**record, "run_id": "r2"}, 10,
                                             RunParts(("x",)), events)
    assert not refused
    with pytest.raises(UnloggableEvent):  # content the log cannot hold: nothing either
        await backend.renew_and_append("doc-w", record, 10, RunParts(("y",)),
                                       [{"type": "tool.call", "n": 2**70}])
    assert (await backend.head("doc-w")).last_seq == 2
    assert await backend.run_parts("doc-w") == ["a"]
    assert (await backend.active_run("doc-w") or {}).get("status") == "waiting_tool"


async def test_only_the_lease_holder_frees_the_document(backend: Backend) -> None:
    """A release names the instance releasing: another instance's (one whose run was
    taken over, say) leaves the run active, so it cannot end a run it no longer drives."""
    record = {"run_id": "r1", "status": "running", "owner": "instance-1"}
    assert await backend.claim_run("doc-o", record, 10) is None
    await backend.release_run("doc-o", "r1", "instance-2")
    assert (await backend.active_run("doc-o") or {}).get("run_id") == "r1"
    await backend.release_run("doc-o", "r2", "instance-1")  # not the active run
    assert (await backend.active_run("doc-o") or {}).get("run_id") == "r1"
    await backend.release_run("doc-o", "r1", "instance-1")
    assert await backend.active_run("doc-o") is None
    assert await backend.claim_run("doc-o", {**record, "run_id": "r2"}, 10) is None


async def test_a_run_taken_over_is_freed_by_its_new_holder_only() -> None:
    async with redis_process() as proc:
        backend = RedisBackend(proc.url)
        await backend.start()
        try:
            record = {"run_id": "r1", "status": "running", "owner": "instance-1"}
            assert await backend.claim_run("doc-t", record, 0.05) is None
            await asyncio.sleep(0.1)  # the lease lapses; a survivor's janitor takes the run
            assert [doc for doc, _ in await backend.expired_runs("survivor", 10)] == ["doc-t"]
            await backend.release_run("doc-t", "r1", "instance-1")  # the stalled old owner
            assert (await backend.active_run("doc-t") or {}).get("run_id") == "r1"
            await backend.release_run("doc-t", "r1", "survivor")
            assert await backend.active_run("doc-t") is None
        finally:
            await backend.close()


async def test_a_checkpointed_write_whose_reply_was_lost_is_not_done_twice() -> None:
    """A retry of the same decision's write (its reply lost, the write done) logged its
    events a second time: a `tool.call` announced twice, a second `tool.done`."""
    async with redis_process() as proc:
        backend = RedisBackend(proc.url)
        await backend.start()
        try:
            record = {"run_id": "r1", "status": "running", "owner": "instance-1"}
            assert await backend.claim_run("doc-i", record, 10) is None
            written = {**record, "status": "waiting_tool", "write": "w-1"}
            events = [{"type": "tool.call", "run_id": "r1", "call_id": "c1"}]
            for _ in range(2):  # the same write, twice
                assert await backend.renew_and_append("doc-i", written, 10,
                                                      RunParts(("a",), reset=True), events)
            assert (await backend.head("doc-i")).last_seq == 1
            assert await backend.run_parts("doc-i") == ["a"]
            assert await backend.renew_and_append(  # the next decision's write goes on
                "doc-i", {**written, "write": "w-2"}, 10, RunParts(("b",)), events)
            assert (await backend.head("doc-i")).last_seq == 2
            assert await backend.run_parts("doc-i") == ["a", "b"]
        finally:
            await backend.close()
