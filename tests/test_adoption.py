"""`run_events`: where an adopted chat's run begins in the document log (adoption.py)."""

from typing import Any

from protocol.server import RunStarted
from server.adapters.adoption import run_events
from server.backends.memory import MemoryBackend


def _started(run_id: str) -> dict[str, Any]:
    return RunStarted(run_id=run_id, mode="agent", user_id="alice", client_id="ai-sdk:c",
                      prompt="p").to_wire()


async def _changes(backend: MemoryBackend, count: int) -> None:
    for n in range(count):
        await backend.append("d", {"type": "document.changed", "n": n})


async def test_the_runs_start_is_found_beyond_the_first_window() -> None:
    backend = MemoryBackend()
    await backend.append("d", _started("run-a"))
    await _changes(backend, 300)
    await backend.append("d", _started("run-b"))
    await _changes(backend, 300)
    epoch, last, events = await run_events(backend, "d", "run-a", 10_000)
    assert epoch == (await backend.head("d")).epoch and last == 602
    assert [e.seq for e in events] == list(range(1, 603))
    _, _, events = await run_events(backend, "d", "run-b", 10_000)
    assert events[0].seq == 302 and events[0].type == "run.started" and events[-1].seq == 602


async def test_a_start_that_left_the_log_gives_what_the_log_kept() -> None:
    backend = MemoryBackend(log_max_events=100)
    await backend.append("d", _started("run-a"))
    await _changes(backend, 300)
    _, last, events = await run_events(backend, "d", "run-a", 100)
    assert last == 301 and [e.seq for e in events] == list(range(202, 302))
    _, _, none = await run_events(backend, "empty", "run-a", 100)
    assert none == []
