"""A resent edit is applied once however many other clients edit meanwhile.

The run kept the keys of the last 32 edits it applied, of all senders: another
client's 32 edits, made while a refused edit waited for its resend, pushed its key
out, and the resend moved the run's scope a second time. Now it keeps the last few
keys of each sender (`edits.with_key`), so others' edits cannot evict them.
"""

from collections.abc import Callable
from typing import Any

from server.backends.base import BackendUnavailable
from tests.harness import joined, running_server
from tests.test_edit_scope import scoped_run


def _reply_to(message_id: str) -> Callable[[dict[str, Any]], bool]:
    return lambda e: e.get("reply_to") == message_id


def _edit(message_id: str, version: int, at: int, insert: int) -> dict[str, Any]:
    return {"type": "editor.change", "id": message_id, "document_version": version,
            "changes": [{"from": at, "to": at, "insert": insert}]}


async def test_other_clients_edits_do_not_evict_a_refused_edits_key() -> None:
    async with running_server() as server, \
            joined(server, "doc-1", sub="alice", client_id="a") as (alice, _), \
            joined(server, "doc-1", sub="bob", client_id="b") as (bob, _), \
            joined(server, "doc-1", sub="carol", client_id="c") as (carol, _):
        backend = server.services.backend
        real, failed = backend.append_once, list[str]()

        async def flaky(document_id: str, event: Any, write_id: str) -> Any:
            if write_id.startswith("edit.") and not failed:  # the run applied it, then this
                failed.append(write_id)
                raise BackendUnavailable("injected: Redis blip logging document.changed")
            return await real(document_id, event, write_id)
        backend.append_once = flaky  # type: ignore[method-assign]
        await scoped_run(alice, "overlap", [{"from": 20, "to": 30}])
        first = _edit("b.1", 2, 0, 5)  # before the scope: moves it to 25..35
        await bob.send(first)
        refused = await bob.recv_until(lambda e: e.get("reply_to") == "b.1")
        assert refused.get("code") == "unavailable"
        for i in range(40):  # carol types after the scope meanwhile
            await carol.send(_edit(f"c.{i}", 3 + i, 200, 1))
            await carol.recv_until(_reply_to(f"c.{i}"))
        await bob.send(first)  # the resend, as static/client.js does
        await bob.recv_until(lambda e: e.get("reply_to") == "b.1")
        await carol.send(_edit("c.last", 50, 0, 1))  # a marker: moves the scope by one
        await carol.recv_until(lambda e: e.get("reply_to") == "c.last")
        last = await alice.recv_until(lambda e: e.get("type") == "run.scope"
                                      and e["scope"][0]["from"] in (26, 31))
        assert last["scope"][0]["from"] == 26, "the resent edit moved the scope twice"
