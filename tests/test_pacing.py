"""Fair turns (server/agent/pacing.py): while the event loop is behind and many
streams publish, a stream that has just sent a delta waits its turn, and the
ones that waited come back first in, first out; a few streams never wait."""

import asyncio
import time
from collections.abc import Callable

from server.agent import pacing


async def _probe_once(gate: pacing.Turns, lag_s: float) -> None:
    """Hold the loop up for `lag_s`, then let the gate's probe run (late)."""
    time.sleep(lag_s)  # noqa: ASYNC251 - blocking the loop is the point
    ticks = 0
    while gate.lag == 0.0 and ticks < 100:
        await asyncio.sleep(0.001)
        ticks += 1


async def test_a_lone_stream_never_waits_even_when_the_loop_is_behind() -> None:
    gate = pacing.Turns()
    assert gate.after_delta() is None  # starts the probe
    await _probe_once(gate, 0.03)
    assert gate.lag > pacing.BEHIND_S
    assert not gate.behind
    assert gate.after_delta() is None


async def test_crowded_streams_wait_while_the_loop_is_behind_and_come_back_in_order() -> None:
    gate = pacing.Turns()
    assert all(gate.after_delta() is None for _ in range(pacing.CROWD + 1))
    await _probe_once(gate, 0.03)
    assert gate.behind
    found = [gate.after_delta() for _ in range(4)]
    turns = [turn for turn in found if turn is not None]
    assert len(turns) == 4
    order: list[int] = []

    def note(index: int) -> Callable[[asyncio.Future[None]], None]:
        return lambda _: order.append(index)

    for index, turn in enumerate(turns):
        turn.add_done_callback(note(index))
    turns[1].cancel()  # a stream aborted while it waited
    waited = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(turns[0], turns[2], turns[3]), 1.0)
    assert time.perf_counter() - waited <= pacing.MAX_HOLD_S + 0.5
    assert order == [1, 0, 2, 3]  # the cancel came first; the others in the order they stopped
    assert gate.waiting == 0 and not gate.behind  # the loop kept up again: nobody waits
    assert gate.after_delta() is None

