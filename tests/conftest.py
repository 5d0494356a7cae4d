from collections.abc import AsyncIterator

import pytest

from tests.harness import Server, running_server


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    async with running_server() as srv:
        yield srv
