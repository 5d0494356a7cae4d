"""What a hanging async test was waiting on, printed before pytest-timeout fails it.

pytest-timeout (the `timeout` in pyproject.toml) turns a hung test into a
failure and prints every *thread's* stack, but a hung asyncio test shows only
the event loop idling in `select`. This plugin schedules, shortly before that
timeout, a dump of every asyncio task's stack onto the loop the main thread
is running, which is what tells the next reader which await never returned.
"""

import asyncio
import sys
import threading
from collections.abc import Generator
from types import FrameType

import pytest

_EARLY_S = 15.0  # how long before pytest-timeout fires the task stacks are printed


def _running_loop(frame: FrameType | None) -> asyncio.AbstractEventLoop | None:
    """The event loop whose `run_forever` is on the main thread's stack, if any."""
    while frame is not None:
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, asyncio.AbstractEventLoop) and \
                frame.f_code.co_name == "run_forever":
            return candidate
        frame = frame.f_back
    return None


def _print_tasks(nodeid: str, loop: asyncio.AbstractEventLoop) -> None:
    out = sys.stderr
    out.write(f"\n--- {nodeid}: still running; its asyncio tasks ---\n")
    for task in asyncio.all_tasks(loop):
        out.write(f"\n{task!r}\n")
        task.print_stack(file=out)
    out.flush()


def _report(nodeid: str) -> None:
    main = threading.main_thread().ident
    frame = sys._current_frames().get(main) if main is not None else None
    loop = _running_loop(frame)
    if loop is not None and not loop.is_closed():
        loop.call_soon_threadsafe(_print_tasks, nodeid, loop)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    timeout = item.config.getini("timeout")
    marker = item.get_closest_marker("timeout")
    seconds = float(marker.args[0]) if marker and marker.args else float(timeout or 0)
    timer = None
    if seconds > _EARLY_S * 2:
        timer = threading.Timer(seconds - _EARLY_S, _report, args=(item.nodeid,))
        timer.daemon = True
        timer.start()
    try:
        yield
    finally:
        if timer is not None:
            timer.cancel()
