"""An `editor.change` refused `unavailable` after the run applied it, sent again under
the same `id` (PROTOCOL.md sections 11 and 13; static/client.js does so).

The run decides on the edit before its `document.changed` is logged; that write's
reply was lost here (Redis did it, the connection broke before the answer came), so
the sender was told `unavailable` and sent the edit again. The resend applied the
edit to the run a second time (a scoped run's scope moved twice, whether the run is
on this instance or forwarded to its owner) and logged a second `document.changed`.
Now the run remembers the keys of the edits it applied (`RunState.edit_keys`) and the
`document.changed` is written under a write id: once each.

Real redis-server; the person's instance runs in this process behind a proxy that
drops the reply of its first `document.changed` append.
"""

from collections.abc import Callable
from typing import Any

import pytest

from tests.cluster_support import instance, join
from tests.harness import Client, joined, running_server
from tests.kill_proxy import DropReplyProxy
from tests.redis_support import redis_process
from tests.test_edit_scope import scoped_run
from tests.test_redis_idempotent import _log

pytestmark = pytest.mark.redis

CHANGED = b'"type":"document.changed"'  # the marker of its append
SCOPE = [{"from": 20, "to": 30}]


def _reply_to(message_id: str) -> Callable[[dict[str, Any]], bool]:
    return lambda e: e.get("reply_to") == message_id


def _edit(message_id: str, version: int, insert: int) -> dict[str, Any]:
    """A person's insertion at the start of the document: before the run's scope."""
    return {"type": "editor.change", "id": message_id, "document_version": version,
            "changes": [{"from": 0, "to": 0, "insert": insert}]}


async def _refused_then_resent(bob: Client, proxy: DropReplyProxy, edit: dict[str, Any]
                               ) -> None:
    """Bob's `edit`, refused `unavailable` (its `document.changed` append lost its
    reply), then sent again as it was, and acknowledged. An edit of the run's own first
    (it leaves the scope as it is) loads the append's script: the lost reply would be a
    `NOSCRIPT` refusal, nothing logged, on a fresh Redis."""
    await bob.send({"type": "editor.change", "id": "e0", "document_version": 1,
                    "origin": "agent"})
    assert (await bob.recv_until(_reply_to("e0")))["type"] == "ack"
    proxy.armed = True
    await bob.send(edit)
    refused = await bob.recv_until(_reply_to(edit["id"]), timeout=15)
    assert proxy.fired.is_set()
    assert (refused["type"], refused.get("code")) == ("error", "unavailable"), refused
    await bob.send(edit)
    again = await bob.recv_until(_reply_to(edit["id"]), timeout=15)
    assert again["type"] == "ack", again


async def _logged(port: int, run_id: str) -> tuple[list[Any], list[Any]]:
    """The scopes of the run's `run.scope` events and the document versions of the
    `document.changed` events, as Redis holds them."""
    logged = await _log(port, "doc-1")
    return ([e["scope"] for e in logged if e["type"] == "run.scope" and e["run_id"] == run_id],
            [e["document_version"] for e in logged if e["type"] == "document.changed"])


async def test_a_resent_edit_moves_a_local_runs_scope_once() -> None:
    async with redis_process() as redis, DropReplyProxy(redis.port, CHANGED) as proxy, \
            running_server(redis_url=proxy.url) as server, joined(server) as (alice, _), \
            joined(server, sub="bob", client_id="b") as (bob, _):
        run_id = (await scoped_run(alice, "overlap", SCOPE))["run_id"]
        await _refused_then_resent(bob, proxy, _edit("e1", 2, 5))
        await bob.send(_edit("e2", 3, 1))
        assert (await bob.recv_until(_reply_to("e2"), timeout=15))["type"] == "ack"
        scopes, changed = await _logged(redis.port, run_id)
        assert scopes == [[{"from": 25, "to": 35}], [{"from": 26, "to": 36}]], scopes
        assert changed == [1, 2, 3], changed  # was [1, 2, 2, 3]


async def test_a_resent_edit_forwarded_to_the_runs_owner_moves_its_scope_once() -> None:
    async with redis_process() as redis, DropReplyProxy(redis.port, CHANGED) as proxy, \
            instance(redis) as owner, running_server(redis_url=proxy.url) as typist, \
            join(owner) as (alice, _), joined(typist, sub="bob", client_id="b") as (bob, _):
        run_id = (await scoped_run(alice, "overlap", SCOPE))["run_id"]
        await _refused_then_resent(bob, proxy, _edit("e1", 2, 5))
        # Edits reach the owner in order: the resend was dealt with before this one.
        await bob.send(_edit("e2", 3, 1))
        await alice.recv_until(lambda e: e.get("type") == "run.scope"
                               and e.get("document_version") == 3, timeout=15)
        scopes, changed = await _logged(redis.port, run_id)
        assert scopes == [[{"from": 25, "to": 35}], [{"from": 26, "to": 36}]], scopes
        assert changed == [1, 2, 3], changed


async def test_a_resent_edit_that_aborted_the_run_is_logged_once() -> None:
    async with redis_process() as redis, DropReplyProxy(redis.port, CHANGED) as proxy, \
            running_server(redis_url=proxy.url) as server, joined(server) as (alice, _), \
            joined(server, sub="bob", client_id="b") as (bob, _):
        run_id = (await scoped_run(alice, "abort", None))["run_id"]
        await _refused_then_resent(bob, proxy, _edit("e1", 2, 5))
        logged = await _log(redis.port, "doc-1")
        ends = [(e["status"], e["reason"]) for e in logged
                if e["type"] == "run.finished" and e["run_id"] == run_id]
        assert ends == [("aborted", "document_changed")]
        changed = [e["document_version"] for e in logged if e["type"] == "document.changed"]
        assert changed == [1, 2], changed  # was [1, 2, 2]
