"""Durable runs (PROTOCOL.md section 13) on the coordinator's side: taking a run
over from its checkpoint, and handing a run over when draining.

`adopt` is called by the janitor (`server/agent/remote.py`) once this instance
holds the lease of a run whose owner is gone; the run machine's resume rules
(`server/agent/resume.py`) decide what happens next. Before that, the janitor
calls `let_go_if_ended`, which frees a run that had already ended (its owner
died after logging `run.finished`, before it freed the run): nothing is
announced, the run is not brought back. A run that cannot be taken over ends
`server_lost` (`end_orphan`). `hand_over` is the
draining owner's half: the run stops here without ending, its last state is
left as the checkpoint, and its lease lapses at once.

Whether a model call cut mid-stream had sent text (then `message.discarded`
is logged before it is made again) is read from the log, back from its head a
page at a time, to the event the call followed (`message_streamed`): however
many events came after its text. Nothing is written per delta for it.
"""

import contextlib
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Literal

import orjson

from server.agent.admission import toolbox_for
from server.agent.checkpoint import to_checkpoint
from server.agent.checkpoint_parts import join_checkpoint
from server.agent.driver import RunDriver
from server.agent.environment import RunEnvironment
from server.agent.machine import RunMachine
from server.agent.run_state import TERMINAL, orphan_state
from server.agent.steps import End, LeaseLost, Publish, Release, Resume
from server.agent.work import now_ms
from server.backends.base import (
    Backend,
    BackendUnavailable,
    LoggedEvent,
    RunRegistry,
    run_ended_in_log,
)
from server.observability import Metrics
from server.ports import EventLog, LocalPresence

logger = logging.getLogger("cowrite.agent")
FINISHED_LOOKBACK = 2000  # log entries searched for the run.finished of a run not yet freed
STREAMED_PAGE = 1000  # log entries read at a time, newest first, for the cut message's text
# A run's events that come before the model call of its open message: the decision that
# made the call logged them (with the checkpoint naming the message), or an earlier one.
# While the call streams, the run logs only that message's deltas and `run.scope`.
BEFORE_CALL = frozenset({"run.queued", "run.started", "run.resumed", "message.discarded",
                         "message.done", "tool.call", "approval.requested",
                         "approval.resolved", "tool.done"})


async def message_streamed(registry: RunRegistry, document_id: str, run_id: str,
                           message_id: str) -> bool:
    """Whether `message_id`, the message of `run_id`'s model call that was cut, had
    logged text. The log is read back from its head a page at a time until one of the
    message's deltas or an event its model call came after (`BEFORE_CALL`): a fixed
    window of the last events missed text followed by more events than it held (a
    stalled stream while people edit), and a frontend then kept both texts. When the
    log no longer reaches back that far (trimmed, or restarted) the answer is True: a
    `message.discarded` of a message a client never saw takes nothing away."""
    head = await registry.head(document_id)
    until = head.last_seq
    while until > 0:
        page = await registry.read_after(document_id, head.epoch,
                                         max(0, until - STREAMED_PAGE), until)
        if not isinstance(page, list):
            return True
        found = _streamed_in(page, run_id, message_id)
        if found is not None:
            return found
        until -= STREAMED_PAGE
    return True  # the run's start is not in this log


def _streamed_in(page: list[LoggedEvent], run_id: str, message_id: str) -> bool | None:
    """What a page of the log (oldest first) says, read newest first: True at one of
    the message's deltas (or its end), False at an earlier event of the run, None when
    it says nothing (read the page before it)."""
    for event in reversed(page):
        if event.type != "message.delta" and event.type not in BEFORE_CALL:
            continue
        data = orjson.loads(event.frame)
        if data.get("run_id") != run_id:
            continue
        if data.get("message_id") == message_id and event.type in ("message.delta",
                                                                   "message.done"):
            return True
        if event.type in BEFORE_CALL:
            return False
    return None


async def let_go_if_ended(registry: RunRegistry, instance_id: str, document_id: str,
                          record: dict[str, Any]) -> bool:
    """Whether the run of `record` (`instance_id` just took its lapsed lease) had already
    ended: then its final record is written if missing and the document freed, with
    nothing announced. Taken over, such a run came back to life (`run.resumed`, its
    answer again and a second `run.finished`; a cancelled run waited on its call again,
    the document busy). Its end is written with its last checkpoint (`driver.py`), its
    final record before the document is freed, and the `run.finished` of an ending
    logged another way is among the log's last events."""
    run_id = str(record.get("run_id"))
    checkpoint = record.get("checkpoint")
    status = next((str(s) for s in (record.get("status"), checkpoint.get("status")
                                    if isinstance(checkpoint, dict) else None)
                   if s in TERMINAL), None)
    final = await registry.get_run_record(document_id, run_id)
    final_status = final.get("status") if final is not None else None
    recorded = final_status in TERMINAL
    status = status or (str(final_status) if recorded else None) or \
        await run_ended_in_log(registry, document_id, run_id, FINISHED_LOOKBACK)
    if status is None:
        return False
    logger.warning("run %s had ended (%s) before its owner freed it; freeing it", run_id,
                   status, extra={"document_id": document_id, "run_id": run_id})
    if not recorded:
        await registry.put_run_record(document_id, run_id, {
            "status": status, "user_id": record.get("user_id"),
            "client_id": record.get("client_id")})
    await registry.release_run(document_id, run_id, instance_id)
    return True


async def end_orphan(backend: Backend, machine: RunMachine, metrics: Metrics,
                     instance_id: str, document_id: str, record: dict[str, Any]) -> None:
    """End a run that cannot be taken over (`instance_id` holds its lapsed lease) through
    the run machine, as any other ending: `aborted`/`server_lost`, its pending call's
    `tool.done` and its one `run.finished`, then free the document."""
    state = orphan_state(document_id, record)
    logging.getLogger("cowrite.remote").warning(  # where it was logged before
        "run %s lost its owner %s", state.run_id, record.get("owner"),
        extra={"document_id": document_id, "run_id": state.run_id})
    decision = machine.decide(state, End("aborted", "server_lost"))
    logged = 0  # write ids the same at every tick: a janitor that failed halfway and
    for effect in decision.effects:  # tries again logs nothing twice
        if isinstance(effect, Publish):
            for event in effect.events:
                logged += 1
                await backend.append_once(document_id, event.to_wire(),
                                          f"orphan:{state.run_id}:{logged}")
        elif isinstance(effect, Release):
            final = decision.state
            await backend.put_run_record(document_id, final.run_id, {
                "status": final.status, "user_id": final.user_id,
                "client_id": final.client_id})
            metrics.runs.labels(effect.status).inc()
    await backend.release_run(document_id, state.run_id, instance_id)


class TakeoverMixin:
    """Takeover and handoff of `RunCoordinator` (which provides these attributes)."""

    document_id: str
    env: RunEnvironment
    log: EventLog
    local: LocalPresence
    active: RunDriver | None
    _finished: Callable[[RunDriver], None]

    async def adopt(self, record: dict[str, Any], reason: Literal["owner_lost", "handoff"]
                    ) -> bool:
        """Take over the run of `record` (its owner is gone; this instance holds its lease
        now) from its checkpoint; False when there is none to go on from."""
        checkpoint = record.get("checkpoint")
        if not isinstance(checkpoint, dict) or self.active is not None:
            return False
        restored = join_checkpoint(checkpoint, await self.env.registry.run_parts(
            self.document_id))
        if restored is None:  # the parts the record counts are gone: nothing to go on from
            logger.error("run %s: its checkpoint parts are missing; it cannot be taken over",
                         record.get("run_id"), extra={"document_id": self.document_id})
            return False
        state = replace(restored,
                        executor_present=self.local.has_client(str(record.get("user_id")),
                                                               str(record.get("client_id"))))
        text_sent = state.phase == "model" and state.message_id is not None and \
            await message_streamed(self.env.registry, self.document_id, state.run_id,
                                   state.message_id)
        spec = None if state.current is None or self.env.tools is None else next(
            (t for t in self.env.tools.specs() if t.name == state.current.name), None)
        driver = RunDriver(state, self.env, self.log, toolbox_for(state, self.env),
                           self._finished)
        self.active = driver
        logger.warning("taking over run %s (%s)", state.run_id, reason,
                       extra={"document_id": self.document_id, "run_id": state.run_id})
        started = await driver.start(None, None, Resume(reason, now_ms(), text_sent,
                                                        spec is not None and spec.idempotent))
        # Lost again at once (this instance stalled): the instance that holds it now goes on.
        return started or driver.last_live_state is not None

    async def hand_over(self) -> None:
        """Draining with another instance alive: stop the run here without ending it, leave
        its final checkpoint, and let its lease lapse at once so a survivor takes it over
        (`run.resumed` `handoff`)."""
        driver = self.active
        if driver is None:
            return
        await driver.submit(LeaseLost())
        await driver.done.wait()
        state = driver.last_live_state
        if state is None or state.finished:
            return
        record = {**state.to_record(self.env.instance_id), "checkpoint": to_checkpoint(state),
                  "handoff": True}
        with contextlib.suppress(BackendUnavailable):
            await self.env.registry.hand_off_run(self.document_id, record)
