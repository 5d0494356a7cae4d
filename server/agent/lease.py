"""A run's hold on its document in the shared registry: lease, record, release.

The instance that runs a run renews its lease while it lives and shares a
snapshot of it (pending calls, status) with the other instances, so they can
answer `welcome.active_run`, forward messages to the owner, and end the run
if the owner dies. With one process (the memory backend) nobody else reads
the record, so checkpoints cost nothing there.
"""

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from server.agent.checkpoint_parts import CheckpointWrite, Written, split_checkpoint
from server.agent.environment import RunEnvironment
from server.agent.run_state import RunState
from server.agent.wire_events import LoggedEventSource
from server.backends.base import BackendUnavailable, RunMovedOn, RunParts, cancel_requested
from server.log_groups import DecisionCheckpoint
from server.ports import EventLog

logger = logging.getLogger("cowrite.agent")
RELEASE_RETRY_S = 0.1


class RunLease:
    def __init__(self, env: RunEnvironment) -> None:
        self.env = env
        self._written = Written()  # what the run's shared parts list holds (none known yet)
        # One write at a time: two interleaved writes would both append from the same
        # count (the renewal's and a decision's), and the parts list would be corrupt.
        self._lock = asyncio.Lock()
        self._confirmed = time.monotonic()  # when the lease was last known to be ours
        # A decision's state from its checkpoint until its events are logged (the driver
        # clears it): what a renewal in between shares, not the older committed state,
        # which would undo the checkpoint.
        self.announcing: RunState | None = None

    @property
    def lock(self) -> asyncio.Lock:
        return self._lock

    @property
    def shared(self) -> bool:
        return self.env.registry.remote

    @property
    def stale(self) -> bool:
        """Whether this instance has not confirmed its lease for half a lease: it stalled
        (a renewal is due every third), so another instance may hold the run by now."""
        return self.shared and time.monotonic() - self._confirmed > \
            self.env.settings.run_lease_s / 2

    async def checkpoint(self, state: RunState) -> bool:
        """Share `state`; False only when the lease is known to be lost. The record gets
        the small part of the checkpoint, the run's parts list only what was added since
        the last write (`checkpoint_parts.py`), both in one atomic step."""
        if not self.shared:
            return True
        async with self._lock:
            return await self._write_held(state)

    async def _write_held(self, state: RunState) -> bool:
        return await self._write(state) or (await self._reclaim(state)
                                            and await self._write(state))

    async def _reclaim(self, state: RunState) -> bool:
        """Claim the run again if the registry lost it: no record of it and nobody holding
        the document (Redis came back without its data: a restart without persistence,
        an empty replica). The run goes on here; it used to stop without a
        `run.finished`, and its clients were told it did not exist. A run taken over or
        ended by another instance has a record: that one stays lost."""
        registry, document_id = self.env.registry, state.document_id
        try:
            if await registry.get_run_record(document_id, state.run_id) is not None:
                return False
            if await registry.claim_run(document_id, state.to_record(self.env.instance_id),
                                        self.env.settings.run_lease_s) is not None:
                return False  # another run holds the document now
            await registry.put_run_record(document_id, state.run_id, {
                "status": "running", "user_id": state.user_id, "client_id": state.client_id})
        except BackendUnavailable:
            return False
        logger.warning("run claimed again: the shared registry had lost it",
                       extra={"run_id": state.run_id, "document_id": document_id})
        self._written = Written()  # its checkpoint parts went with the rest: rewrite them
        return True

    async def announce(self, state: RunState) -> bool:
        """Share `state` before the events that announce it (a survivor then knows every
        call); False when the lease turned out to be another instance's."""
        self.announcing = state
        if await self.checkpoint(state):
            return True
        self.announcing = None
        return False

    def decision_write(self, state: RunState) -> "DecisionWrite":
        """`state`'s checkpoint, to be written with the events of its decision in one
        step (`publish_many`, under `self.lock`); what `announce` did in two."""
        self.announcing = state
        return DecisionWrite(self, state)

    def prepare(self, state: RunState
                ) -> tuple[dict[str, Any], RunParts | None, CheckpointWrite | None]:
        """The record to write for `state` and the checkpoint parts added since the last
        write, with the split that `wrote` notes once they are written."""
        record = state.to_record(self.env.instance_id)
        if not self.env.settings.durable_runs:  # off: the record only (no takeover possible)
            return record, None, None
        split = split_checkpoint(state, self._written)
        record["checkpoint"] = split.checkpoint
        return record, RunParts(split.entries, split.reset), split

    def wrote(self, split: CheckpointWrite | None, written: bool | None) -> None:
        """The bookkeeping of a write: done (the lease is confirmed, the parts counted),
        refused (nothing changes) or unknown (None: rewrite the parts whole next time)."""
        if written is None:
            self._written = Written()
        elif written:
            self._confirmed = time.monotonic()
            if split is not None:
                self._written = split.written

    async def _write(self, state: RunState) -> bool:
        try:
            record, parts, split = self.prepare(state)
            renewed = await self.env.registry.renew_run(state.document_id, record,
                                                        self.env.settings.run_lease_s, parts)
        except BackendUnavailable:
            self.wrote(None, None)  # whether the parts were appended is unknown
            return True  # the renewal loop keeps trying; the lease still runs
        except (TypeError, ValueError):  # content the encoder refuses (the decision that
            logger.warning("checkpoint skipped: it cannot be encoded",  # carries it is
                           extra={"run_id": state.run_id})  # refused when it is logged)
            return True
        self.wrote(split, renewed)
        return renewed

    async def still_held(self, state: RunState) -> bool:
        """Whether this instance may still end and free the run (a driver's last resort):
        a stale lease is confirmed first, as the driver fences a decision, since a driver
        that failed while its instance stalled may have lost the run to another instance,
        where it goes on. An error while confirming keeps the old answer: it is held."""
        if not self.stale:
            return True
        try:
            return await self.checkpoint(state)
        except Exception:
            logger.exception("could not confirm the lease of a failed run",
                             extra={"run_id": state.run_id})
            return True

    async def keep(self, current: Callable[[], RunState]) -> bool:
        """Renew every third of the lease; True once it is lost, False when the run
        ended or moved on here (checked too, not only the cancel, which a library can
        swallow: see `cancel_requested`; renewing on would hold the run forever)."""
        while True:
            await asyncio.sleep(self.env.settings.run_lease_s / 3)
            async with self._lock:  # the state as of the write: one read before waiting
                state = current()  # for the lock could be older than the decision written
                if state.finished or cancel_requested():  # meanwhile (the run's end: its
                    return False  # checkpoint says so, `TakeoverMixin.let_go_if_ended`)
                held = await self._write_held(state)
            if not held:
                logger.warning("run lost its lease; another instance holds it now",
                               extra={"run_id": state.run_id})
                return True

    async def free(self, state: RunState) -> None:
        """Free the document with no final record (a failed driver's last resort); only
        while this instance holds the lease (the backend checks)."""
        await self.env.registry.release_run(state.document_id, state.run_id,
                                            self.env.instance_id)

    async def release(self, state: RunState) -> None:
        """Write the final record, then free the document, retrying a backend outage for
        half a lease (after that the lease lapses and a survivor cleans up)."""
        registry = self.env.registry
        self.env.metrics.runs.labels(state.status).inc()
        record = {"status": state.status, "user_id": state.user_id, "client_id": state.client_id}
        deadline = time.monotonic() + self.env.settings.run_lease_s / 2
        while True:
            try:
                await registry.put_run_record(state.document_id, state.run_id, record)
                await registry.release_run(state.document_id, state.run_id, self.env.instance_id)
                return
            except BackendUnavailable:
                if time.monotonic() > deadline:
                    logger.error("could not free the document: backend unavailable",
                                 extra={"run_id": state.run_id,
                                        "document_id": state.document_id})
                    return
                await asyncio.sleep(RELEASE_RETRY_S)


class DecisionWrite:
    """A `DecisionCheckpoint` (server/log_groups.py): the lease's record and parts for the
    decision's state, prepared again for each attempt, under one write id."""

    def __init__(self, lease: RunLease, state: RunState) -> None:
        self._lease, self._state = lease, state
        self._split: CheckpointWrite | None = None
        self.write_id = uuid.uuid4().hex[:16]  # the same for every attempt (idempotence)

    def begin(self) -> tuple[dict[str, Any], float, RunParts | None]:
        record, parts, self._split = self._lease.prepare(self._state)
        record["write"] = self.write_id
        return record, self._lease.env.settings.run_lease_s, parts

    def end(self, written: bool | None) -> None:
        self._lease.wrote(self._split, written)


class FencedLog:
    """The log as a run's model stream writes to it (Redis): before a delta, a lease
    not confirmed for a while (the instance stalled) is confirmed first, so an owner
    that lost its run does not stream text into the new owner's story."""

    def __init__(self, log: EventLog, lease: RunLease, current: Callable[[], RunState]
                 ) -> None:
        self._log, self._lease, self._current = log, lease, current
        self.remote = log.remote

    async def publish_many(self, events: Sequence[LoggedEventSource],
                           checkpoint: DecisionCheckpoint | None = None) -> None:
        await self._log.publish_many(events, checkpoint)

    async def publish_delta(self, run_id: str, message_id: str, delta: str) -> None:
        if self._lease.stale and not await self._lease.checkpoint(self._current()):
            raise RunMovedOn(run_id)
        await self._log.publish_delta(run_id, message_id, delta)
