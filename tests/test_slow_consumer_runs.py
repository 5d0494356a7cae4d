"""A connection closed for falling behind (4009) while it is starting a run: the run it
started is the document's one active run, or it did not start; never a run beside it."""

import asyncio

from tests.harness import RawClient, joined, make_settings, running_server, token
from tests.runs import script

QUEUE_MAX = 16


async def test_a_run_started_by_a_connection_closed_for_falling_behind_stays_the_active_one(
        ) -> None:
    settings = make_settings(outbound_queue_max=QUEUE_MAX, outbound_max_bytes=256 * 1024 * 1024)
    async with running_server(settings) as srv, \
            joined(srv, sub="alice", client_id="a") as (alice, _):
        stuck = await RawClient.connect(srv.settings.port, "/v1/documents/doc-1/ws")
        stuck.send({"type": "hello", "protocol": 1, "client_id": "x", "token": token("xavier")})
        await asyncio.sleep(0.2)
        session = srv.services.hub.sessions["doc-1"]
        outbound = next(c.outbound for c in session.connections.values()
                        if c.user_id == "xavier")
        # Its socket full (700 KB frames it does not read), then its queue at the bound:
        # the `run.started` of its own run is the event that takes it over (4009).
        while not outbound.has_pending_send:
            await alice.send({"type": "run.start", "prompt": script(
                {"say": "y" * 700_000}, chunk_chars=700_000)})
            await alice.recv_until("run.finished", timeout=30)
            await asyncio.sleep(0.1)
        while outbound._queued_events < QUEUE_MAX:
            await alice.send({"type": "editor.change", "origin": "agent"})
            await alice.recv_until("document.changed")
        stuck.send({"type": "run.start", "id": "xs", "run_id": "x-run", "prompt": script(
            {"say": "x" * 400}, chunk_chars=4, delay_ms=50)})
        started = await alice.recv_until(lambda e: e.get("type") == "run.started" and
                                         e.get("run_id") == "x-run", timeout=10)
        assert started["user_id"] == "xavier"
        await asyncio.sleep(0.5)
        assert outbound.close_request is not None and outbound.close_request.code == 4009

        # The document is busy with it: alice's run waits (it used to start and stream
        # beside it, and x-run could no longer be cancelled: "has finished").
        await alice.send({"type": "run.start", "id": "mine", "run_id": "a-run",
                          "prompt": script({"say": "alice"})})
        answer = await alice.recv_until(lambda e: e.get("reply_to") == "mine")
        assert answer.get("status") == "queued" or answer.get("code") == "document_busy", answer
        async with joined(srv, sub="xavier", client_id="x2") as (again, welcome):
            assert welcome["active_run"]["run_id"] == "x-run"
            await again.send({"type": "run.cancel", "id": "c", "run_id": "x-run"})
            finished = await again.recv_until(lambda e: e.get("type") == "run.finished" and
                                              e.get("run_id") == "x-run", timeout=10)
            assert finished["status"] == "cancelled"
        stuck.close()
