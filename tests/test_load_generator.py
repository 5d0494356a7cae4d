"""The load generator is a tool operators trust: it must verify cleanly against
a healthy server, and its verifier must catch a broken stream."""

from dataclasses import asdict

import pytest

from bench.common import BENCH_SECRET
from bench.load import LoadClient, Scenario, Stats, markdown, run_scenario
from bench.scenarios import run_apart
from tests.harness import running_server


async def test_mixed_scenario_verifies_clean() -> None:
    scenario = Scenario(name="test-mixed", docs=4, collaborators=3, runs=2, deltas=30, tools=2,
                        approvals=1, delay_ms=2, cancel_rate=0.2, edit_rate=0.3, drop_rate=0.3,
                        ramp_s=0.1, seed=3)
    async with running_server(jwt_secret=BENCH_SECRET, rate_messages_per_s=0,
                              rate_runs_per_min=0) as srv:
        url = f"ws://127.0.0.1:{srv.settings.port}"
        report = await run_scenario(scenario, [url], [], progress=False)
    assert report["verification_errors"] == {}
    assert sum(report["runs_finished"].values()) == 8
    assert report["resumes"] > 0 and report["abort_ms"]["n"] > 0
    assert report["tool_rtt_ms"]["n"] > 0 and report["first_delta_ms"]["n"] == 8
    assert "| first_delta (ms) |" in markdown(report)


async def test_crowded_streams_on_a_lagging_loop_lose_nothing() -> None:
    """60 runs stream at once into a server that shares its loop with the load
    generator, so the loop falls behind: streams take turns and their text merges
    (the scripted model keeps its own clock), and every stream still verifies
    clean: gapless, no duplicate, deltas equal to message.done, one run.finished."""
    scenario = Scenario(name="test-crowded", docs=60, deltas=100, tools=1, delay_ms=2,
                        catch_up=True, ramp_s=0.1, seed=5)
    async with running_server(jwt_secret=BENCH_SECRET, rate_messages_per_s=0,
                              rate_runs_per_min=0) as srv:
        url = f"ws://127.0.0.1:{srv.settings.port}"
        report = await run_scenario(scenario, [url], [], progress=False)
    assert report["verification_errors"] == {}
    assert report["runs_finished"] == {"completed": 60}
    # per run: run.started, 2 + 100 pieces of text, tool.call, tool.done, 2 message.done,
    # run.finished; merged text makes fewer events than that
    assert report["events"] < 60 * 109


@pytest.mark.slow
async def test_a_scenario_run_apart_is_the_scenario_asked_for() -> None:
    """`make bench` runs its load scenario in a generator process of its own: the
    report it reads back is of that scenario, verified."""
    scenario = Scenario(name="test-apart", docs=3, deltas=7, tools=1, delay_ms=1,
                        catch_up=True, edit_rate=0.5, ramp_s=0.1, seed=9)
    report = await run_apart(scenario)
    assert report["scenario"] == asdict(scenario)
    assert report["verification_errors"] == {} and sum(report["runs_finished"].values()) == 3
    assert report["server_cpu_s"] > 0 and report["client_cpu_s"] > 0


def test_verifier_catches_gaps_duplicates_and_mismatched_text() -> None:
    stats = Stats()
    client = LoadClient("ws://unused", "t", "c", stats, driver=False)
    events = [
        {"type": "message.delta", "seq": 1, "run_id": "r", "message_id": "m", "delta": "ab"},
        {"type": "message.delta", "seq": 1, "run_id": "r", "message_id": "m", "delta": "ab"},
        {"type": "message.delta", "seq": 3, "run_id": "r", "message_id": "m", "delta": "c"},
        {"type": "message.done", "seq": 4, "run_id": "r", "message_id": "m", "text": "abcd"},
        {"type": "run.finished", "seq": 5, "run_id": "r", "status": "completed", "steps": 1},
        {"type": "run.finished", "seq": 6, "run_id": "r", "status": "completed", "steps": 1},
    ]
    for event in events:
        client._on_event(event, 0.0)
    assert stats.errors == {"duplicate_event": 1, "seq_gap": 1, "deltas_differ_from_done": 1,
                            "run_finished_twice": 1}
