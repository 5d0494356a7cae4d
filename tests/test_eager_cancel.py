"""A turn started eagerly (`start_eagerly`: the scripted model's turns, a sender's turn
in the run inbox) and cancelled before its task's first step: the cancel must reach
the coroutine where it waits. It used to be dropped there, mid-`async for`; its
generator, left "running", was collected with "Task exception was never retrieved
... aclose(): asynchronous generator is already running" on stderr (Redis: a
`run.cancel` or an edit applied right after a tool result started a streaming turn)."""

import asyncio
import gc
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from server.continuation import start_eagerly
from tests.harness import joined, running_server
from tests.redis_support import redis_process
from tests.runs import call, script, start


@contextmanager
def loop_errors() -> Iterator[list[dict[str, Any]]]:
    """What the running loop's exception handler is given while the block runs."""
    loop = asyncio.get_running_loop()
    seen: list[dict[str, Any]] = []
    before = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: seen.append(context))
    try:
        yield seen
    finally:
        loop.set_exception_handler(before)


async def test_a_turn_cancelled_before_its_first_step_unwinds_where_it_waits() -> None:
    closed: list[str] = []

    async def chunks() -> AsyncIterator[int]:
        try:
            await asyncio.sleep(10)
            yield 1
        finally:
            closed.append("generator")

    async def turn() -> None:
        async for _ in chunks():
            pass

    with loop_errors() as errors:
        task = start_eagerly(turn(), asyncio.get_running_loop().create_task)
        assert task is not None
        task.cancel()  # in the same step that started it, as a driver's StopWork does
        with pytest.raises(asyncio.CancelledError):
            await task
        gc.collect()
        await asyncio.sleep(0.01)
    assert closed == ["generator"]
    assert errors == []


async def test_a_turn_cancelled_before_its_first_step_cancels_what_it_waits_on() -> None:
    """As a task cancelled while it waits cancels the future it waits on: the child a
    turn awaited went on running, and awaiting it later raised "await wasn't used with
    future"."""
    child = asyncio.ensure_future(asyncio.sleep(5))

    async def turn() -> None:
        await child

    task = start_eagerly(turn(), asyncio.get_running_loop().create_task)
    assert task is not None
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert child.cancelled()


@pytest.mark.redis
@pytest.mark.parametrize("ending", ["run.cancel", "editor.change"])
async def test_a_streaming_turn_ended_as_it_starts_leaves_no_stray_task(ending: str) -> None:
    with loop_errors() as errors:
        async with redis_process() as redis, \
                running_server(redis_url=redis.url) as server, \
                joined(server, client_id="tab-1") as (tab, _), \
                joined(server, client_id="tab-2") as (other, _):
            for attempt in range(3):
                await start(tab, script({"tool_calls": [call("read_document")]},
                                        {"say": "x" * 400}, delay_ms=10))
                tool_call = await tab.recv_until("tool.call", timeout=10)
                run_id = tool_call["run_id"]
                # The ending comes in while the result's decision is being logged: it is
                # applied right after that decision started the streaming turn.
                await asyncio.gather(
                    tab.send({"type": "tool.result", "run_id": run_id,
                              "call_id": tool_call["call_id"], "token": tool_call["token"],
                              "output": {"text": "the document"}}),
                    other.send({"type": "run.cancel", "id": f"c{attempt}", "run_id": run_id}
                               if ending == "run.cancel" else
                               {"type": "editor.change", "document_version": attempt + 1,
                                "origin": "user"}))
                finished = await tab.recv_until("run.finished", timeout=10)
                assert finished["run_id"] == run_id
                assert finished["status"] in ("cancelled", "aborted"), finished
                gc.collect()
                await asyncio.sleep(0.05)
    assert [context.get("message") for context in errors] == []


async def test_an_eagerly_started_task_shows_its_coroutine_and_where_it_waits() -> None:
    """Its task read `coro=<<_Rest without __name__>()>` with an empty stack: the hang
    report (tests/hang_report.py) showed nothing for model and inbox turns."""
    async def model_turn() -> None:
        await asyncio.sleep(10)

    task = start_eagerly(model_turn(), asyncio.get_running_loop().create_task)
    assert task is not None
    try:
        assert "model_turn()" in repr(task)
        assert [frame.f_code.co_name for frame in task.get_stack()] == ["model_turn"]
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
