"""The bundled JS client sends a refused edit again, and the run sees it (PROTOCOL.md
sections 11 and 13).

Bob's tab (static/client.js under node, tests/node/edit_resend.mjs) edits the
document while the run is owned by another instance and Redis is away for Bob's
instance for longer than it looks the owner up (2 s): the edit is refused
`unavailable` before anything is done. The client sent its edits without an `id`,
so it could not tell which message was refused and never sent it again: the run was
not aborted, and went on writing over Bob's text. Now the edit carries an `id` and is
sent again after `retry_after_ms`; once Redis is back it reaches the owner and the
run ends `aborted`/`document_changed`.

Needs node and the `ws` package of tests/node (`make node-deps`); skipped without
them, except in CI.
"""

import asyncio
import os
import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.cluster_support import instance, join
from tests.harness import running_server, token
from tests.redis_support import redis_process
from tests.runs import call, script, start
from tests.test_edit_outage import LEASE_S, LOOKUP
from tests.test_outage_gaps import OutageProxy

pytestmark = [pytest.mark.redis, pytest.mark.slow]

NODE_DIR = Path(__file__).resolve().parent / "node"


def _node() -> str:
    node = shutil.which("node")
    if node is None or not (NODE_DIR / "node_modules" / "ws").exists():
        if os.environ.get("CI") == "true":
            pytest.fail("node and tests/node's npm packages are required in CI (make node-deps)")
        pytest.skip("node or tests/node/node_modules missing: run `make node-deps`")
    return node


async def _tab(node: str, base_url: str) -> list[dict[str, Any]]:
    """Bob's tab, from its edit to that edit's ack: every event it got."""
    process = await asyncio.create_subprocess_exec(
        node, str(NODE_DIR / "edit_resend.mjs"), base_url, token("bob"), "doc-1",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    return [orjson.loads(line) for line in out.splitlines() if line.strip()]


async def test_the_client_sends_a_refused_edit_again_and_the_run_elsewhere_sees_it() -> None:
    node = _node()
    async with redis_process() as redis, \
            OutageProxy(redis.port, LOOKUP, outage_s=3.0, forward=False) as proxy, \
            instance(redis, {"COWRITE_RUN_LEASE_S": str(LEASE_S)}) as owner, \
            running_server(redis_url=proxy.url, run_lease_s=LEASE_S) as typist, \
            join(owner) as (alice, _):
        await start(alice, script({"tool_calls": [call("read_document")]}, {"say": "x"}),
                    run_id="r-1")
        await alice.recv_until(lambda e: e.get("type") == "tool.call")
        proxy.armed = True
        events = await _tab(node, f"ws://127.0.0.1:{typist.settings.port}")
        assert proxy.fired.is_set()
        edit_id = next(e["id"] for e in events if e["type"] == "edit.sent")
        answers = [(e["type"], e.get("code")) for e in events
                   if edit_id and e.get("reply_to") == edit_id]
        assert edit_id and answers, events  # was: no id (an `error` with no `reply_to`)
        assert answers[0] == ("error", "unavailable"), events  # the owner could not be found
        assert answers[-1] == ("ack", None), events  # sent again until it got in
        finished = await alice.recv_until(lambda e: e.get("type") == "run.finished", timeout=20)
        assert (finished["status"], finished["reason"]) == ("aborted", "document_changed")
