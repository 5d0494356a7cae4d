from collections.abc import AsyncIterator

import pytest

from tests.browser_support import (  # the `browser` and `dev_server` fixtures, for
    browser_fixture,  # noqa: F401 - every browser test module
    dev_server_fixture,  # noqa: F401
)
from tests.harness import Server, running_server

# asyncio task stacks of a test about to time out; `python -m server` instances forked
# from a process that already imported the server (the imports are most of a start); a
# test that leaves a socket or transport open fails itself, never a later test
pytest_plugins = ["tests.hang_report", "tests.server_zygote", "tests.leaks"]


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    async with running_server() as srv:
        yield srv
