"""An owner that does not know it lost its run (PROTOCOL.md section 13, issue 12).

An instance that stalls longer than the lease (a long GC pause, a starved core, a
stopped VM) loses its runs to a survivor without knowing it. When it wakes up, the
first thing it may do is apply a tool result a tab sent it meanwhile. It must not
commit that result itself (its `tool.done` would tell the tab the result arrived
while the new owner waits for it until the call times out): the result goes on to
the run's new owner. SIGSTOP/SIGCONT make the stall deterministic."""

import signal

import pytest

from tests.cluster_support import cluster, ended, join, start_run
from tests.runs import answer, call, of_run, script

pytestmark = pytest.mark.redis
TAKEOVER_S = 15  # the lease (1 s) + a janitor tick, on a loaded 2-core machine
# A tool timeout long enough for a loaded machine, short enough that a lost result
# shows up as a failed test (a `tool.done` `timeout`) instead of a hung one.
ENV = {"COWRITE_RUN_LEASE_S": "1", "COWRITE_TOOL_TIMEOUT_S": "20"}


async def test_a_result_sent_to_a_stalled_owner_reaches_the_run_s_new_owner() -> None:
    steps = script({"tool_calls": [call("read_document")]}, {"say": "thanks"})
    async with cluster(env=ENV) as (_, (stalled, survivor)), \
            join(survivor, sub="bob", client_id="watch") as (watcher, _), \
            join(stalled) as (tab, _):
        await start_run(tab, steps, "so-1")
        tool_call = await tab.recv_until("tool.call")
        stalled.process.send_signal(signal.SIGSTOP)
        try:
            resumed = await watcher.recv_until("run.resumed", timeout=TAKEOVER_S)
            assert (resumed["run_id"], resumed["reason"]) == ("so-1", "owner_lost")
            # The tab still talks to the stalled instance: its result waits in the socket
            # and is the first thing that instance reads when it wakes up.
            await answer(tab, tool_call, {"text": "the document"}, id="r-1")
        finally:
            stalled.process.send_signal(signal.SIGCONT)
        ack = await tab.recv_until(lambda e: e.get("reply_to") == "r-1", timeout=TAKEOVER_S)
        assert (ack["type"], ack.get("status")) == ("ack", "accepted"), ack
        finished = await watcher.recv_until(ended("so-1"), timeout=TAKEOVER_S)
        assert finished["status"] == "completed", finished
        await tab.recv_until(ended("so-1"), timeout=TAKEOVER_S)
    for client in (watcher, tab):
        dones = of_run(client.events, "so-1", "tool.done")
        assert [(d["call_id"], d["status"]) for d in dones] == [(tool_call["call_id"], "ok")]
        assert len(of_run(client.events, "so-1", "tool.call")) == 1
        assert len(of_run(client.events, "so-1", "run.finished")) == 1
        assert [e["seq"] for e in client.events if "seq" in e] == sorted(
            {e["seq"] for e in client.events if "seq" in e})  # none twice, in order
    assert "thanks" in "".join(d["delta"] for d in of_run(watcher.events, "so-1",
                                                          "message.delta"))


async def test_a_stalled_owner_streams_nothing_into_the_new_owner_s_story() -> None:
    text = "word " * 60
    async with cluster(env=ENV) as (_, (stalled, survivor)), \
            join(survivor, sub="bob", client_id="watch") as (watcher, _), \
            join(stalled) as (tab, _):
        await start_run(tab, script({"say": text}, chunk_chars=5, delay_ms=40), "so-2")
        for _ in range(3):
            await watcher.recv_until("message.delta")
        stalled.process.send_signal(signal.SIGSTOP)
        try:
            resumed = await watcher.recv_until("run.resumed", timeout=TAKEOVER_S)
            assert (resumed["run_id"], resumed["reason"]) == ("so-2", "owner_lost")
        finally:  # wakes up with a delta due: it must find out before logging it
            stalled.process.send_signal(signal.SIGCONT)
        finished = await watcher.recv_until(ended("so-2"), timeout=TAKEOVER_S)
        assert finished["status"] == "completed", finished
        await tab.recv_until(ended("so-2"), timeout=TAKEOVER_S)
    for client in (watcher, tab):
        events = of_run(client.events, "so-2")
        cut = [e["message_id"] for e in events if e["type"] == "message.discarded"]
        assert cut == ["so-2:m1"], cut
        after = events[[e["type"] for e in events].index("message.discarded"):]
        assert not [e for e in after if e.get("message_id") == "so-2:m1"
                    and e["type"] == "message.delta"], "a delta of the cut message came late"
        done = [e for e in events if e["type"] == "message.done"]
        assert [d["text"] for d in done] == [text]
        assert "".join(e["delta"] for e in events if e["type"] == "message.delta"
                       and e["message_id"] == done[0]["message_id"]) == text
        assert [e["seq"] for e in client.events if "seq" in e] == sorted(
            {e["seq"] for e in client.events if "seq" in e})
