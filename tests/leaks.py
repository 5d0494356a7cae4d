"""Leaked sockets, transports and pipes fail the test that leaked them, never a later one.

A socket or asyncio transport a test forgets to close is finalized whenever the garbage
collector next runs: often during some later test, where its ResourceWarning (an error
under pyproject's `filterwarnings = ["error"]`) failed that innocent test (seen in CI: a
browser test's setup failed on a socket a Redis proxy of an earlier test had left open).

So at the end of every test's teardown (after its fixtures, its event loop included, are
gone) this plugin collects the garbage the test left and fails the test, naming each
resource it leaked. Everything still alive at that point is then frozen (`gc.freeze`): the
collector ignores it during the next tests, so an object that outlives its test (held by
something long-lived) and is dropped later is not finalized in an unrelated test either.
Such late leaks, found only when the frozen objects are swept (every `SWEEP_EVERY` tests
and at the end of the run), are listed in the run's summary: no test can be blamed.

`PYTHONTRACEMALLOC=25 pytest tests/...::the_test` adds where each leaked object was created.
"""

import gc
import tracemalloc
import warnings
from collections.abc import Generator
from typing import Any

import pytest

SWEEP_EVERY = 200  # tests between two sweeps of the frozen objects (bounds their garbage)

_late: list[str] = []  # late leaks: (where they surfaced) what leaked
_since_sweep = 0


def _describe(caught: warnings.WarningMessage) -> str:
    """One leaked resource: the warning, its object with its addresses, where it was made."""
    line = f"{caught.category.__name__}: {caught.message}"
    source: Any = caught.source
    if source is None:
        return line
    extra = getattr(source, "get_extra_info", None)
    if callable(extra):  # a transport: its socket's ends say whose connection it was
        with_addresses = [f"{name}={extra(name)!r}" for name in ("sockname", "peername")
                          if extra(name) is not None]
        if with_addresses:
            line += f" ({', '.join(with_addresses)})"
    made = tracemalloc.get_object_traceback(source) if tracemalloc.is_tracing() else None
    if made is not None:
        line += "\n    created at:\n" + "\n".join(
            f"      {frame}" for frame in made.format(most_recent_first=True))
    return line


def _collect() -> list[str]:
    """Collect the garbage; what its finalizers warned about (ResourceWarning, mostly)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # each one, recorded rather than raised in __del__
        gc.collect()
    return [_describe(warning) for warning in caught]


def _sweep(where: str) -> None:
    gc.unfreeze()
    _late.extend(f"({where}) {leak}" for leak in _collect())


_LEAKS = pytest.StashKey[list[str]]()


# After the fixtures' teardown (the test's event loop closed), before pytest's unraisable
# check: what a finalizer raises is reported in this test. (pytest registers only functions
# named pytest_*.)
@pytest.hookimpl(trylast=True, specname="pytest_runtest_teardown")
def pytest_runtest_teardown_collect(item: pytest.Item) -> None:
    global _since_sweep
    try:
        item.stash[_LEAKS] = _collect()
        _since_sweep += 1
        if _since_sweep >= SWEEP_EVERY:
            _since_sweep = 0
            _sweep(f"swept after {item.nodeid}")
    finally:
        gc.freeze()


@pytest.hookimpl(wrapper=True, specname="pytest_runtest_teardown")
def pytest_runtest_teardown_fail(item: pytest.Item) -> Generator[None, None, None]:
    """Fails the test, once every teardown check (pytest's unraisable one too) has run."""
    try:
        yield
    except BaseException as error:
        if leaks := item.stash.get(_LEAKS, None):
            error.add_note(_message(item, leaks))
        raise
    if leaks := item.stash.get(_LEAKS, None):
        pytest.fail(_message(item, leaks), pytrace=False)


def _message(item: pytest.Item, leaks: list[str]) -> str:
    return (f"{item.nodeid} left {len(leaks)} resource(s) open:\n"
            + "\n".join(f"  {leak}" for leak in leaks))


def pytest_sessionfinish() -> None:
    _sweep("swept at the end of the run")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _late:
        terminalreporter.section("resources leaked by tests that cannot be named")
        terminalreporter.line(
            "still referenced when their test ended, finalized later: look for "
            "module-level or thread-held references\n" + "\n".join(_late))
