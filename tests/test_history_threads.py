"""Fair history eviction across threads (memory_history.py, redis_history.py): a
document keeps at most `HISTORY_MAX_ENTRIES` entries, and what goes when an append
takes it over is the oldest entry of the thread holding the most. Checked on both
backends against a reference model, through a real redis-server, from a document
written by the old layout (one list, oldest out whatever its thread), and end to end:
a quiet thread stays listed in `GET /v1/documents/{id}/threads`."""

import asyncio
import contextlib
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
import redis.asyncio as aioredis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server.backends.base import Backend
from server.backends.memory import HISTORY_MAX_ENTRIES, MemoryBackend
from server.backends.redis import RedisBackend
from tests.harness import joined, running_server, token
from tests.redis_support import RedisProcess, redis_process
from tests.runs import script, start

CAP = HISTORY_MAX_ENTRIES
# Threads as entries carry them: no thread_id and "" are the default thread ("main").
THREADS = st.sampled_from(["a", "b", "c", "main", "", None])
BATCHES = st.lists(st.lists(THREADS, min_size=1, max_size=4), min_size=1, max_size=25)


def thread_of(entry: dict[str, Any]) -> str:
    return str(entry.get("thread_id") or "main")


def reference(appended: list[dict[str, Any]], cap: int) -> list[dict[str, Any]]:
    """The rule, as plainly as it can be written: append each entry; while over the cap,
    drop the oldest entry of the thread with the most (ties: the thread whose oldest
    entry is oldest), which is the first kept entry whose thread has the most."""
    kept: list[dict[str, Any]] = []
    for entry in appended:
        kept.append(entry)
        if len(kept) > cap:
            counts = Counter(thread_of(e) for e in kept)
            most = max(counts.values())
            del kept[next(i for i, e in enumerate(kept) if counts[thread_of(e)] == most)]
    return kept


def entry(n: int, thread: str | None) -> dict[str, Any]:
    made: dict[str, Any] = {"role": "user" if n % 2 == 0 else "assistant",
                            "content": f"m{n}", "run_id": f"r{n // 2}", "ts": 1000 + n}
    if thread is not None:
        made["thread_id"] = thread
    return made


@pytest.fixture
async def redis() -> AsyncIterator[RedisProcess]:
    async with redis_process() as proc:
        yield proc


async def redis_backend(proc: RedisProcess, cap: int = CAP) -> RedisBackend:
    backend = RedisBackend(proc.url, history_max_entries=cap)
    await backend.start()
    return backend


@pytest.fixture(params=["memory", "redis"])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    if request.param == "memory":
        yield MemoryBackend()
        return
    async with redis_process() as proc:
        made = await redis_backend(proc)
        try:
            yield made
        finally:
            await made.close()


async def test_a_busy_thread_over_the_cap_leaves_a_quiet_thread_its_entries(
        backend: Backend) -> None:
    """Before, the busy thread's appends pushed the quiet thread's entries out."""
    doc = uuid.uuid4().hex
    quiet = [entry(0, "quiet"), entry(1, "quiet")]
    busy = [entry(n, "busy") for n in range(2, CAP + 102)]
    await backend.append_history(doc, quiet[:1])
    await backend.append_history(doc, busy[:10])
    await backend.append_history(doc, quiet[1:])
    for start_at in range(10, len(busy), 500):
        await backend.append_history(doc, busy[start_at:start_at + 500])
    kept = await backend.read_history(doc)
    assert len(kept) == CAP
    assert [e for e in kept if e["thread_id"] == "quiet"] == quiet
    assert [e for e in kept if e["thread_id"] == "busy"] == busy[-(CAP - 2):]
    assert kept == reference([quiet[0], *busy[:10], quiet[1], *busy[10:]], CAP)


async def test_one_thread_keeps_its_newest_entries_as_before(backend: Backend) -> None:
    doc = uuid.uuid4().hex
    appended = [entry(n, None) for n in range(CAP + 30)]
    await backend.append_history(doc, appended[:CAP - 5])
    await backend.append_history(doc, appended[CAP - 5:])
    assert await backend.read_history(doc) == appended[-CAP:]
    assert await backend.read_history(uuid.uuid4().hex) == []


async def test_equal_threads_lose_their_oldest_first(backend: Backend) -> None:
    """Ties between the largest threads go to the one whose oldest entry is oldest: a new
    thread's first entry is never the one evicted while an older thread is as large."""
    doc = uuid.uuid4().hex
    appended = [entry(n, f"t{n}") for n in range(CAP + 3)]  # a thread per entry
    await backend.append_history(doc, appended)
    assert await backend.read_history(doc) == appended[3:]


def _numbered(batches: list[list[str | None]]) -> list[list[dict[str, Any]]]:
    numbered, n = [], 0
    for batch in batches:
        numbered.append([entry(n + i, thread) for i, thread in enumerate(batch)])
        n += len(batch)
    return numbered


@given(cap=st.integers(1, 8), batches=BATCHES)
@settings(max_examples=300, deadline=None)
async def test_memory_eviction_follows_the_reference(
        cap: int, batches: list[list[str | None]]) -> None:
    backend, appended = MemoryBackend(history_max_entries=cap), []
    for batch in _numbered(batches):
        await backend.append_history("d", batch)
        appended += batch
        assert await backend.read_history("d") == reference(appended, cap)


@given(cap=st.integers(1, 6), batches=BATCHES)
@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
async def test_redis_eviction_follows_the_reference(
        redis: RedisProcess, cap: int, batches: list[list[str | None]]) -> None:
    backend, appended, doc = await redis_backend(redis, cap), [], uuid.uuid4().hex
    try:
        for batch in _numbered(batches):
            await backend.append_history(doc, batch)
            appended += batch
            assert await backend.read_history(doc) == reference(appended, cap)
    finally:
        await backend.close()


async def test_concurrent_appends_from_two_instances_keep_the_bound(
        redis: RedisProcess) -> None:
    """Each append is one script: nothing lost or doubled, each thread keeps its newest,
    the two busy threads end up even (the larger one loses whoever appends)."""
    one, two, doc = await redis_backend(redis, 40), await redis_backend(redis, 40), "busy-doc"
    try:
        async def write(backend: Backend, thread: str, count: int) -> None:
            for n in range(count):
                await backend.append_history(doc, [{"thread_id": thread, "n": n}])

        await asyncio.gather(write(one, "a", 150), write(two, "b", 100), write(two, "c", 5),
                             write(one, "c2", 2))
        kept = await one.read_history(doc)
    finally:
        await one.close()
        await two.close()
    assert len(kept) == 40
    counts = Counter(e["thread_id"] for e in kept)
    assert counts["c"] == 5 and counts["c2"] == 2 and abs(counts["a"] - counts["b"]) <= 1
    for thread, appended in (("a", 150), ("b", 100)):
        assert [e["n"] for e in kept if e["thread_id"] == thread] == \
            list(range(appended - counts[thread], appended))


async def test_a_document_of_the_old_layout_is_read_then_taken_in(redis: RedisProcess
                                                                   ) -> None:
    """The old code's one list (`cw:{doc}:hist`, plain JSON, oldest out whatever the
    thread): read as it is, then taken into the per-thread layout by the next append,
    in its order and before the new entry, and counted for the cap. The old list stays,
    written as the old code wrote it (for a rollback)."""
    doc, raw = uuid.uuid4().hex, aioredis.Redis.from_url(redis.url)
    old = [entry(0, "quiet"), *[entry(n, None) for n in range(1, CAP - 1)],
           {"role": "user", "content": "odd", "thread_id": 7},
           {"role": "tool", "content": "é \"x\" | y", "thread_id": "busy", "tool_call_id": "c"}]
    backend = await redis_backend(redis)
    try:
        await raw.rpush(f"cw:{{{doc}}}:hist", *(orjson.dumps(e) for e in old))
        assert await backend.read_history(doc) == old
        new = [entry(n, "main") for n in range(CAP, CAP + 3)]
        await backend.append_history(doc, new)
        mirrored = [orjson.loads(item) for item in await raw.lrange(f"cw:{{{doc}}}:hist", 0, -1)]
        assert mirrored == [*old, *new][-CAP:]  # what the old code would hold
        kept = await backend.read_history(doc)
        assert kept == reference([*old, *new], CAP)
        assert kept[0] == old[0] and kept[-3:] == new  # main lost its oldest, not quiet
        await backend.append_history(doc, [entry(CAP + 3, "quiet")])
        assert (await backend.read_history(doc)) == reference(
            [*old, *new, entry(CAP + 3, "quiet")], CAP)
    finally:
        await backend.close()
        await raw.aclose()


@pytest.mark.parametrize("shared", [False, True], ids=["memory", "redis"])
async def test_a_quiet_thread_stays_listed_after_a_busy_one_passes_the_cap(
        shared: bool) -> None:
    """A real run on a quiet thread, then more than the cap of entries on a busy one
    (written through the backend: a run per entry would take minutes)."""
    doc = f"doc-{uuid.uuid4().hex[:8]}"
    async with contextlib.AsyncExitStack() as stack:
        overrides: dict[str, Any] = {}
        if shared:
            overrides["redis_url"] = (await stack.enter_async_context(redis_process())).url
        srv = await stack.enter_async_context(running_server(**overrides))
        alice, _ = await stack.enter_async_context(joined(srv, doc))
        ack = await start(alice, script({"say": "quiet answer"}), thread_id="quiet")
        await alice.recv_until(lambda e: e.get("type") == "run.finished"
                               and e.get("run_id") == ack["run_id"])
        busy = [entry(n, "busy") for n in range(CAP + 50)]
        for at in range(0, len(busy), 500):
            await srv.services.backend.append_history(doc, busy[at:at + 500])
        async with httpx.AsyncClient(base_url=srv.http, headers={
                "Authorization": f"Bearer {token(docs=[doc])}"}) as http:
            listed = (await http.get(f"/v1/documents/{doc}/threads")).json()["threads"]
            quiet = (await http.get(f"/v1/documents/{doc}/history?thread=quiet")).json()
            all_busy = (await http.get(f"/v1/documents/{doc}/history?thread=busy")).json()
    assert {t["thread_id"]: t["runs"] for t in listed}["quiet"] == 1
    assert quiet["messages"][0]["role"] == "user"
    assert "quiet answer" in [m["content"] for m in quiet["messages"]]
    assert len(all_busy["messages"]) == CAP - len(quiet["messages"])
    assert all_busy["messages"][-1]["content"] == busy[-1]["content"]


class _OldRelease:
    """An instance of the previous release on the same Redis, as its backend read and
    wrote history: one list, RPUSH then LTRIM to the newest `CAP`, LRANGE to read."""

    def __init__(self, raw: aioredis.Redis, doc: str) -> None:
        self.raw, self.key = raw, f"cw:{{{doc}}}:hist"

    async def append(self, entries: list[dict[str, Any]]) -> None:
        pipe = self.raw.pipeline(transaction=True)
        pipe.rpush(self.key, *(orjson.dumps(e) for e in entries))
        pipe.ltrim(self.key, -CAP, -1)
        await pipe.execute()

    async def read(self) -> list[dict[str, Any]]:
        return [orjson.loads(item) for item in await self.raw.lrange(self.key, 0, -1)]


async def test_a_rolling_upgrade_keeps_every_instance_s_history(redis: RedisProcess) -> None:
    """Old and new instances side by side (and a rollback after): each reads the whole
    history whoever wrote it. Moving the old list and deleting it left the old release's
    instances with an empty history (a review found it: runs there started without it,
    `/threads` empty, and a rollback lost what the new layout held)."""
    doc, raw = uuid.uuid4().hex, aioredis.Redis.from_url(redis.url)
    old, new = _OldRelease(raw, doc), await redis_backend(redis)
    try:
        await old.append([entry(1, "main"), entry(2, "side")])
        await new.append_history(doc, [entry(3, "main")])
        await old.append([entry(4, "side")])
        await new.append_history(doc, [entry(5, "main")])
        await old.append([entry(6, "main")])
        whole = [entry(n, ("main", "side")[n in (2, 4)]) for n in range(1, 7)]
        assert await old.read() == whole
        assert await new.read_history(doc) == whole  # the old one's last not taken in yet
        await new.append_history(doc, [entry(7, "side")])
        assert await new.read_history(doc) == [*whole, entry(7, "side")]
        assert await old.read() == [*whole, entry(7, "side")]  # a rollback loses nothing
    finally:
        await new.close()
        await raw.aclose()


async def test_a_lost_meta_hash_is_counted_again_from_the_lists(redis: RedisProcess) -> None:
    """The order counter and total live in one hash: deleted or evicted alone, the next
    append counted from 0 again (entries read out of order, the cap no longer held) and
    took the mirrored old list in a second time (a review found the first)."""
    doc, raw, cap = uuid.uuid4().hex, aioredis.Redis.from_url(redis.url), 6
    backend = await redis_backend(redis, cap)
    try:
        first = [entry(n, ("a", "b")[n % 2]) for n in range(1, 6)]
        await backend.append_history(doc, first)
        await raw.delete(f"cw:{{{doc}}}:hist:meta")
        later = [entry(n, "a") for n in range(6, 10)]
        await backend.append_history(doc, later)
        assert await backend.read_history(doc) == reference([*first, *later], cap)
    finally:
        await backend.close()
        await raw.aclose()
