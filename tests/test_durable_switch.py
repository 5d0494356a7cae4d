"""`COWRITE_DURABLE_RUNS=0`: Redis mode with 1.0's behaviour (no checkpoints), the
baseline of the checkpoint-cost benchmark (`bench.durable`). A client must be able
to tell: `durable_runs` is not announced, and a killed owner's run ends
`aborted`/`server_lost` instead of being taken over."""

import asyncio
from dataclasses import replace

import pytest

from server.agent.machine import RunMachine
from server.agent.run_state import ModelCall, ToolOutcome
from server.agent.steps import Begin, CallModel, Checkpoint, ClientToolResult, ModelFinished
from tests.cluster_support import FAST_LEASE, cluster, join, start_run
from tests.runs import call, script
from tests.test_machine_properties import CONFIG, new_state


def test_the_model_step_checkpoint_is_made_only_when_runs_are_durable() -> None:
    """Off, the record writes left are 1.0's, when a pending call opens or closes (the
    closing one also covers the next model step, since a transition writes once)."""
    for durable in (True, False):
        machine = RunMachine(replace(CONFIG, checkpoint_steps=durable))
        begun = machine.decide(new_state(False, 5), Begin(0, "start"))
        assert CallModel() in begun.effects
        assert (Checkpoint() in begun.effects) is durable
        asked = machine.decide(begun.state, ModelFinished(
            "", (ModelCall("c1", "read", "{}", {}),)))
        assert Checkpoint() in asked.effects
        pending = asked.state.current
        assert pending is not None and pending.token is not None
        answered = machine.decide(asked.state, ClientToolResult(
            pending.call_id, pending.token, ToolOutcome("ok", output=1), "alice", 1))
        assert CallModel() in answered.effects
        assert answered.effects.count(Checkpoint()) == 1


@pytest.mark.redis
async def test_without_durable_runs_a_killed_owners_run_ends_server_lost() -> None:
    env = {**FAST_LEASE, "COWRITE_DURABLE_RUNS": "0"}
    async with cluster(env=env) as (_, (one, two)), \
            join(two, sub="bob", client_id="watch") as (watcher, welcome):
        assert "durable_runs" not in welcome["features"]
        assert "run_queue" in welcome["features"]  # the other features stay
        async with join(one) as (doomed, mine):
            assert "durable_runs" not in mine["features"]
            await start_run(doomed, script({"tool_calls": [call("read_document")]},
                                           {"say": "after"}), "off-1")
            tool_call = await doomed.recv_until("tool.call")
            one.process.kill()  # kill -9
            await doomed.expect_close()
        finished = await watcher.recv_until("run.finished", timeout=10)
        assert (finished["run_id"], finished["status"], finished["reason"]) == (
            "off-1", "aborted", "server_lost")
        done = [e for e in watcher.events if e.get("type") == "tool.done"]
        assert [(d["call_id"], d["status"]) for d in done] == [
            (tool_call["call_id"], "cancelled")]
        await asyncio.sleep(0.5)  # a second janitor pass changes nothing
        types = [e.get("type") for e in watcher.events]
        assert "run.resumed" not in types and types.count("run.finished") == 1
