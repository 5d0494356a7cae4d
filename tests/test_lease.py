"""A run's lease against a real redis-server (server/agent/lease.py): checkpoints
written at the same time (the renewal's and a decision's) leave a parts list a
survivor can read, an owner that stalled past its lease logs no more text, and a
driver that failed after such a stall leaves the run to its new owner."""

import asyncio
from collections.abc import AsyncIterator, Sequence
from types import SimpleNamespace
from typing import cast

import pytest

from protocol.server import DurableServerEvent
from server.agent.checkpoint_parts import join_checkpoint
from server.agent.driver import RunDriver
from server.agent.environment import RunEnvironment
from server.agent.lease import FencedLog, RunLease
from server.agent.machine import RunMachine
from server.agent.run_state import PendingCall, RunState
from server.agent.tools import ToolBox
from server.agent.wire_events import LoggedEventSource
from server.backends.base import RunMovedOn
from server.backends.redis import RedisBackend
from server.log_groups import DecisionCheckpoint
from server.observability import Metrics
from server.ports import EventLog
from tests.redis_support import redis_process
from tests.test_machine_properties import CONFIG

pytestmark = pytest.mark.redis
LEASE_S = 0.3


@pytest.fixture
async def backend() -> AsyncIterator[RedisBackend]:
    async with redis_process() as proc:
        redis_backend = RedisBackend(proc.url)
        await redis_backend.start()
        try:
            yield redis_backend
        finally:
            await redis_backend.close()


def lease_on(backend: RedisBackend) -> RunLease:
    settings = SimpleNamespace(run_lease_s=LEASE_S, durable_runs=True)
    return RunLease(cast(RunEnvironment, SimpleNamespace(
        registry=backend, settings=settings, instance_id="owner")))


def state_with(messages: int) -> RunState:
    return RunState(run_id="r1", document_id="d1", mode="agent", user_id="alice",
                    client_id="tab", prompt="p", model="m", max_steps=50, phase="model",
                    messages=tuple({"role": "user", "content": f"m{k}"}
                                   for k in range(messages)))


def grown(state: RunState) -> RunState:
    """`state` with one more message: built on it, as the run machine builds states."""
    return state.evolve(messages=(*state.messages, {"role": "assistant",
                                                    "content": f"m{len(state.messages)}"}))


async def survivor_reads(backend: RedisBackend) -> RunState | None:
    record = await backend.active_run("d1")
    assert record is not None
    return join_checkpoint(record["checkpoint"], await backend.run_parts("d1"))


async def test_checkpoints_written_at_once_leave_a_readable_state(
        backend: RedisBackend) -> None:
    lease = lease_on(backend)
    first = state_with(2)
    assert await backend.claim_run("d1", first.to_record("owner"), 10) is None
    assert await lease.checkpoint(first)
    older = grown(first)
    newer = grown(older)
    newest = grown(newer)
    # A renewal with the committed state and a decision's checkpoint, at the same time;
    # then one more write building on the last.
    assert all(await asyncio.gather(lease.checkpoint(older), lease.checkpoint(newer)))
    assert await lease.checkpoint(newest)
    restored = await survivor_reads(backend)
    assert restored is not None and restored.messages == newest.messages


class Recorded:
    """The document log's side of `FencedLog`: what reached it."""

    remote = True

    def __init__(self) -> None:
        self.deltas: list[str] = []

    async def publish_many(self, events: Sequence[LoggedEventSource],
                           checkpoint: DecisionCheckpoint | None = None) -> None:
        raise AssertionError("not used here")

    async def publish_delta(self, run_id: str, message_id: str, delta: str) -> None:
        self.deltas.append(delta)


async def test_an_owner_that_stalled_past_its_lease_logs_no_more_text(
        backend: RedisBackend) -> None:
    lease, state, log = lease_on(backend), state_with(1), Recorded()
    assert await backend.claim_run("d1", state.to_record("owner"), LEASE_S) is None
    fenced = FencedLog(log, lease, lambda: state)
    await fenced.publish_delta("r1", "r1:m1", "before ")
    await asyncio.sleep(LEASE_S * 0.6)  # stale: it confirms the lease, still its own
    await fenced.publish_delta("r1", "r1:m1", "still mine ")
    await asyncio.sleep(LEASE_S * 1.5)  # lapsed; a survivor's janitor takes the run
    taken = await backend.expired_runs("survivor", LEASE_S)
    assert [document for document, _ in taken] == ["d1"]
    with pytest.raises(RunMovedOn):
        await fenced.publish_delta("r1", "r1:m1", "too late")
    assert log.deltas == ["before ", "still mine "]


class Logged:
    """The document log as a run driver writes to it: the groups of events logged."""

    remote = True

    def __init__(self) -> None:
        self.events: list[DurableServerEvent] = []

    async def publish_many(self, events: Sequence[DurableServerEvent],
                           checkpoint: DecisionCheckpoint | None = None) -> None:
        assert checkpoint is None, "a failed driver's last resort writes no checkpoint"
        self.events.extend(events)

    async def publish_delta(self, run_id: str, message_id: str, delta: str) -> None:
        raise AssertionError("not used here")


def failing_driver(backend: RedisBackend, log: Logged) -> RunDriver:
    """The driver of a run waiting on a client tool, owned by instance "owner"."""
    settings = SimpleNamespace(run_lease_s=LEASE_S, durable_runs=True)
    env = cast(RunEnvironment, SimpleNamespace(
        registry=backend, settings=settings, instance_id="owner", machine=RunMachine(CONFIG),
        metrics=Metrics()))
    waiting = state_with(1).evolve(phase="tools", status="waiting_tool", current=PendingCall(
        "c1", "read_document", {}, "tool", "client", 10**13, "token"))
    return RunDriver(waiting, env, cast(EventLog, log), ToolBox([], None), lambda _: None)


@pytest.mark.parametrize("taken_over", [True, False])
async def test_a_failed_driver_ends_its_run_only_while_it_holds_the_run(
        backend: RedisBackend, taken_over: bool) -> None:
    """However a driver fails, its last resort ends the run (`failed`, `internal_error`)
    and frees the document. After a stall that let another instance take the run
    over, the run is that instance's: nothing is logged and the document stays held."""
    log = Logged()
    driver = failing_driver(backend, log)
    assert await backend.claim_run("d1", driver.state.to_record("owner"), LEASE_S) is None
    if taken_over:
        await asyncio.sleep(LEASE_S * 1.5)  # lapsed; a survivor's janitor takes the run
        assert [doc for doc, _ in await backend.expired_runs("survivor", LEASE_S)] == ["d1"]
    else:
        await asyncio.sleep(LEASE_S * 0.6)  # stale, yet still its own
    await driver._last_resort()  # what `_serve` runs however it ends
    assert driver.done.is_set()
    held = await backend.active_run("d1")
    if taken_over:
        assert log.events == []
        assert held is not None and held["run_id"] == "r1"
    else:
        assert [(e.type, getattr(e, "status", None)) for e in log.events] == [
            ("tool.done", "cancelled"), ("run.finished", "failed")]
        assert held is None
