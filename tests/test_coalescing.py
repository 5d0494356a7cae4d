"""Delta coalescing (PROTOCOL.md section 3): while the stream is saturated
(deltas back to back, or a connection with a send pending), never for a paced
stream to an idle connection; live and replayed streams are identical."""

import time

from tests.harness import Client, RawClient, Server, joined, running_server, token
from tests.runs import of_run, script, start

TEXT = "".join(f"{i:04d} " for i in range(600))  # 3,000 characters


async def test_paced_stream_to_an_idle_document_gets_every_delta(server: Server) -> None:
    async with joined(server) as (client, _):
        ack = await start(client, script({"say": TEXT[:200]}, chunk_chars=4, delay_ms=2))
        await client.recv_until("run.finished")
        deltas = of_run(client.events, ack["run_id"], "message.delta")
        assert [d["delta"] for d in deltas] == [TEXT[i:i + 4] for i in range(0, 200, 4)]


async def test_back_to_back_deltas_merge_before_logging(server: Server) -> None:
    """A fast reader never backs up, yet a model that outpaces the loop gets its
    text merged: fewer, larger events, the same text, the same stream on replay."""
    async with joined(server) as (client, welcome):
        ack = await start(client, script({"say": TEXT}, chunk_chars=3))
        done = await client.recv_until(lambda e: e.get("type") == "message.done" and
                                       e.get("run_id") == ack["run_id"])
        await client.recv_until(lambda e: e.get("type") == "run.finished" and
                                e.get("run_id") == ack["run_id"])
        deltas = of_run(client.events, ack["run_id"], "message.delta")
        assert "".join(d["delta"] for d in deltas) == TEXT == done["text"]
        assert len(deltas) < 1000
        resume = {"epoch": welcome["epoch"], "after_seq": welcome["last_seq"]}
        async with joined(server, client_id="late", resume=resume) as (late, back):
            replayed = [await late.recv() for _ in range(back["replayed"])]
        assert of_run(replayed, ack["run_id"]) == of_run(client.events, ack["run_id"])


async def test_a_stream_reached_late_sends_the_text_due_as_one_delta_live_and_on_replay(
        server: Server) -> None:
    """A model keeps writing while the server is busy elsewhere (the scripted model's
    `catch_up`): the pieces that fell due meanwhile come as one larger delta, and a
    client that resumes later replays exactly the events the live one got."""
    async with joined(server) as (client, welcome):
        ack = await start(client, script({"say": TEXT[:400]}, chunk_chars=4, delay_ms=5,
                                         catch_up=True))
        await client.recv_until("message.delta")
        time.sleep(0.1)  # noqa: ASYNC251 - the loop (server and client) is held up on purpose
        done = await client.recv_until("message.done")
        await client.recv_until("run.finished")
        deltas = of_run(client.events, ack["run_id"], "message.delta")
        assert "".join(d["delta"] for d in deltas) == TEXT[:400] == done["text"]
        assert max(len(d["delta"]) for d in deltas) >= 40  # >= 10 pieces fell due at once
        assert len(deltas) < 100
        resume = {"epoch": welcome["epoch"], "after_seq": welcome["last_seq"]}
        async with joined(server, client_id="late", resume=resume) as (late, back):
            replayed = [await late.recv() for _ in range(back["replayed"])]
        assert of_run(replayed, ack["run_id"]) == of_run(client.events, ack["run_id"])


async def test_backed_up_connection_makes_deltas_merge_without_loss() -> None:
    async with running_server(rate_messages_per_s=0) as srv, joined(srv) as (client, welcome):
        stuck = await _stalled(srv, client)  # MBs of text the stuck client does not read
        ack = await start(client, script({"say": TEXT}, chunk_chars=3))
        done = await client.recv_until(lambda e: e.get("type") == "message.done" and
                                       e.get("run_id") == ack["run_id"])
        await client.recv_until(lambda e: e.get("type") == "run.finished" and
                                e.get("run_id") == ack["run_id"])
        deltas = of_run(client.events, ack["run_id"], "message.delta")
        assert "".join(d["delta"] for d in deltas) == TEXT == done["text"]
        assert len(deltas) < 1000  # 1,000 chunks were merged into fewer events
        seqs = [e["seq"] for e in client.events if "seq" in e]
        assert seqs == list(range(welcome["last_seq"] + 1, welcome["last_seq"] + 1 + len(seqs)))
        stuck.close()
        # a replay is the same stream, event for event
        resume = {"epoch": welcome["epoch"], "after_seq": welcome["last_seq"]}
        async with joined(srv, client_id="late", resume=resume) as (late, back):
            replayed = [await late.recv() for _ in range(back["replayed"])]
        assert of_run(replayed, ack["run_id"]) == of_run(client.events, ack["run_id"])


async def _stalled(srv: Server, client: Client) -> RawClient:
    """A second connection that has stopped reading, a send to it pending but below the
    slow-consumer bound: two runs of 900,000 characters it does not take."""
    stuck = await RawClient.connect(srv.settings.port, "/v1/documents/doc-1/ws")
    stuck.send({"type": "hello", "protocol": 1, "client_id": "stuck", "token": token("sam")})
    for _ in range(2):
        await start(client, script({"say": "y" * 900_000}, chunk_chars=4000))
        await client.recv_until("run.finished", timeout=30)
    outbounds = [c.outbound for c in srv.services.hub.sessions["doc-1"].connections.values()]
    assert len(outbounds) == 2 and all(o.close_request is None for o in outbounds)
    assert any(o.has_pending_send for o in outbounds)  # the stalled one, still connected
    return stuck


async def test_a_stalled_connection_holds_no_one_elses_text_for_long() -> None:
    """Text merged while a connection is backed up is logged within `HOLD_MAX_S` (50 ms)
    anyway: one tab that stopped reading held every other tab's text until the
    message was done (a paced 2 s stream arrived as one delta at the end)."""
    async with running_server(rate_messages_per_s=0) as srv, joined(srv) as (client, _):
        stuck = await _stalled(srv, client)
        ack = await start(client, script({"say": TEXT[:400]}, chunk_chars=4, delay_ms=20))
        await client.recv_until(lambda e: e.get("type") == "message.done" and
                                e.get("run_id") == ack["run_id"], timeout=10)
        deltas = of_run(client.events, ack["run_id"], "message.delta")
        assert "".join(d["delta"] for d in deltas) == TEXT[:400]
        assert len(deltas) >= 10  # was 1 or 2: all of it at the end
        stuck.close()
