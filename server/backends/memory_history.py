"""One document's conversation history in memory, capped fairly across its threads.

A document keeps at most `HISTORY_MAX_ENTRIES` entries for all its threads together
(memory stays bounded however many threads a client opens). When an append takes it
over, the entry that goes is the oldest of the thread holding the most entries (ties:
the thread whose oldest entry is oldest), one per excess entry. Evicting the oldest
entries of the whole document instead let one busy thread push a quiet thread out
entirely, and `GET /v1/documents/{id}/threads` stopped listing it; now a thread loses
entries only while no other thread holds more. A document with one thread keeps its
newest entries, as before.

Entries are kept per thread, each with the order number of its append, so an
eviction touches one thread, and a read merges the threads back into the order of the
appends. The largest thread is the top of a heap of (-count, order of its oldest
entry, thread), pushed again at each change of a thread and read lazily (an item that
no longer matches its thread is dropped when it comes up, the heap is rebuilt once it
holds twice as many items as threads): O(log threads) per append and per eviction,
where a pass over the threads took ~0.3 ms per append with 2,000 threads. The Redis
backend keeps the same layout and rule (redis_history.py)."""

import heapq
from collections import deque
from operator import itemgetter
from typing import Any

from protocol.base import DEFAULT_THREAD

HISTORY_MAX_ENTRIES = 2000

_Kept = deque[tuple[int, dict[str, Any]]]  # (order of the append, entry), oldest first
_Rank = tuple[int, int, str]  # -count, order of the oldest entry, thread


def thread_key(entry: dict[str, Any]) -> str:
    """The thread an entry counts for, as `server.agent.history.thread_of` reads it:
    entries written before threads existed belong to the default thread."""
    return str(entry.get("thread_id") or DEFAULT_THREAD)


class ThreadedHistory:
    """Per-thread deques of (order, entry), their total, the last order number, the
    heap of the threads' ranks."""

    __slots__ = ("_cap", "_order", "_ranks", "_threads", "_total")

    def __init__(self, cap: int = HISTORY_MAX_ENTRIES) -> None:
        self._cap = cap
        self._order = 0
        self._total = 0
        self._threads: dict[str, _Kept] = {}
        self._ranks: list[_Rank] = []

    def __len__(self) -> int:
        return self._total

    def extend(self, entries: list[dict[str, Any]]) -> None:
        """Each entry appended in turn, an eviction after each one that goes over the cap
        (so a batch is kept exactly as the same entries appended one by one)."""
        threads = self._threads
        for entry in entries:
            self._order += 1
            thread = thread_key(entry)
            kept = threads.get(thread)
            if kept is None:
                kept = threads[thread] = deque()
            kept.append((self._order, entry))
            self._rank(thread, kept)
            self._total += 1
            if self._total > self._cap:
                self._evict_one()

    def _rank(self, thread: str, kept: _Kept) -> None:
        """A thread changed: its rank as it is now (the ones before go stale)."""
        ranks = self._ranks
        if len(ranks) > 2 * len(self._threads) + 32:
            ranks[:] = [(-len(k), k[0][0], t) for t, k in self._threads.items() if t != thread]
            heapq.heapify(ranks)
        heapq.heappush(ranks, (-len(kept), kept[0][0], thread))

    def _evict_one(self) -> None:
        """The oldest entry of the largest thread (ties: the oldest oldest entry)."""
        ranks, threads = self._ranks, self._threads
        while True:
            count, oldest, thread = heapq.heappop(ranks)
            kept = threads.get(thread)
            if kept is not None and len(kept) == -count and kept[0][0] == oldest:
                break
        kept.popleft()
        self._total -= 1
        if kept:
            self._rank(thread, kept)
        else:
            del threads[thread]

    def entries(self) -> list[dict[str, Any]]:
        """Every kept entry, in the order they were appended."""
        if len(self._threads) == 1:
            return [entry for _, entry in next(iter(self._threads.values()))]
        merged = heapq.merge(*self._threads.values(), key=itemgetter(0))
        return [entry for _, entry in merged]
