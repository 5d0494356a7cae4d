"""The commit point of a run driver's decision: logging its `Publish` group.

With Redis, a decision that announces something is checkpointed first (a
survivor must know every call its clients were told of). The checkpoint and
the events are written in one atomic step (`renew_and_append`): an owner
killed between two separate writes left a checkpoint whose events were never
logged (a `tool.call` nobody saw; after a takeover the call timed out).
A refusable decision (a client's `tool.result` or `approval`, the start) is
tried once and its sender answered on failure; any other is committed already
and retried through an outage (`publishing.py`): for half a lease, then, fenced
by the lease (written with its checkpoint, under one write id), for up to
`OUTAGE_RETRY_LEASES` leases more while this instance holds the lease, so an
outage neither loses it nor logs it twice. That holds for the run's end (a
survivor then knows it ended) and, since the chaos soak's Redis pauses of 2-3 s
under a 2 s lease, for a running run's decisions too (the model asking for a
tool, a takeover's `run.resumed`): those used to end the run `failed`
`internal_error` after half a lease, though nobody else could take the run while
Redis was away. A failure that ends the run here (`Crashed`, `LeaseLost`)
is applied only once the lease's lock is free (`Then`): applying it wrote the end
under the same lock, which is not re-entrant, and the run hung for ever (no
`run.finished`, the document busy, a shutdown waiting on it). Kept apart from
driver.py, which holds the order of effects.
"""

import logging
from dataclasses import dataclass
from typing import Any

from protocol.codes import ErrorCode
from protocol.server import Error
from server.agent.environment import RunEnvironment
from server.agent.lease import DecisionWrite, RunLease
from server.agent.publishing import (
    PublishFailed,
    PublishNow,
    publish_retrying,
    refusal,
    try_publish,
    unloggable,
)
from server.agent.run_state import RunState
from server.agent.steps import Crashed, Decision, Input, LeaseLost, Publish
from server.agent.wire_events import WireEvent
from server.backends.base import BackendUnavailable, UnloggableEvent
from server.connection import Peer
from server.inbox import Envelope
from server.log_groups import LeaseNotHeld, new_write_id, same_write
from server.ports import EventLog

logger = logging.getLogger("cowrite.agent")
# How long a decision (the run's end or not) is retried through a Redis outage after the
# first half lease, in leases (`_through_outage`). Nobody else can take the run while
# Redis is away, so this bounds only how long a driver (and a shutdown waiting for it)
# waits for Redis.
OUTAGE_RETRY_LEASES = 3


@dataclass(frozen=True, slots=True)
class Then:
    """What a failed commit ends the run with, applied by `_log_decision` once the
    lease's lock is released (applying it writes again, under that lock)."""

    event: Crashed | LeaseLost


Outcome = bool | None | Then


class NotNow:
    """`_logged_now`'s answer when the log cannot take the group at once."""


NOT_NOW = NotNow()


class CommitMixin:
    """Of `RunDriver` (which provides these attributes)."""

    env: RunEnvironment
    log: EventLog
    _publish_now: PublishNow | None  # the log's, when in-process (`publish_now`)
    lease: RunLease
    state: RunState
    _released: bool
    _current: Envelope | None  # the input being applied
    answered: Peer | None  # its sender, once answered before the decision's effects
    waits_out_outage: bool  # a decision is being retried through an outage

    @property
    def run_id(self) -> str:
        return self.state.run_id

    @property
    def log_extra(self) -> dict[str, Any]:
        return {"run_id": self.state.run_id, "document_id": self.state.document_id}

    async def _apply(self, event: Input, peer: Peer | None, sent: Any = None) -> bool:
        raise NotImplementedError

    async def _log_decision(self, publish: Publish, decision: Decision, peer: Peer | None,
                            fence: bool) -> bool | None:
        """The decision's `Publish`: None once logged, else what `_execute` returns. A
        failure that ends the run is applied here, with no lock held (`Then`)."""
        if fence:
            outcome = await self._commit(publish, decision, peer,
                                         self.lease.decision_write(decision.state))
        else:  # with Redis, under a write id of its own: one write, however it is tried
            outcome = await self._publish(publish, decision, peer, None, new_write_id()
                                          if self.env.registry.remote else "")
        return await self._then(outcome) if isinstance(outcome, Then) else outcome

    async def _then(self, outcome: Then) -> bool:
        ended = await self._apply(outcome.event, None)  # the run's end is logged (Crashed)
        return ended and not isinstance(outcome.event, LeaseLost)  # or not ours (False)

    def _logged_now(self, publish: Publish, decision: Decision, peer: Peer | None
                    ) -> Outcome | NotNow:
        """`_publish` (no checkpoint, no write id) as a plain call, when an in-process log
        can append the group at once (`DocumentSession.publish_now`): a round trip's
        decision then reaches the log through no coroutine (it went through five).
        `NOT_NOW`, with nothing logged, when it cannot: `_log_decision`."""
        now = self._publish_now
        if now is None:
            return NOT_NOW
        for event in publish.events:
            if type(event) is not WireEvent:  # to be encoded: `publish_many`
                return NOT_NOW
        try:
            if not now(publish.events):
                return NOT_NOW
        except BackendUnavailable:  # nothing was logged (an in-process log never raises
            return NOT_NOW  # it): the general path answers it as it always did
        except LeaseNotHeld:
            raise
        except Exception as exc:  # as `try_publish` and `publish_retrying` take it
            if decision.refusable:
                return self._refused(refusal(exc, self.log_extra), decision, peer)
            if not isinstance(exc, UnloggableEvent):
                raise
            self.lease.announcing = None
            return self._not_logged(unloggable(exc, self.log_extra), decision)
        return None

    def _refused(self, problem: tuple[ErrorCode, str], decision: Decision, peer: Peer | None
                 ) -> bool:
        self.lease.announcing = None
        if peer is not None:
            peer.reply(Error(code=problem[0], message=problem[1],
                             reply_to=decision.reply_to, run_id=self.run_id,
                             retry_after_ms=1000 if problem[0] == ErrorCode.UNAVAILABLE
                             else None))
        return False

    def _not_logged(self, failed: PublishFailed, decision: Decision) -> Outcome:
        if not decision.state.finished:  # the client is shown the ref: it is logged
            logger.error("a decision of the run could not be logged (%s, ref %s)",
                         failed.why, failed.ref, extra=self.log_extra)
            return Then(Crashed(failed.ref))
        logger.error("the run's end could not be logged (%s)", failed.why,
                     extra=self.log_extra)
        self.state = decision.state
        return True  # the driver's last resort frees the document

    async def _commit(self, publish: Publish, decision: Decision, peer: Peer | None,
                      write: DecisionWrite | None) -> Outcome:
        """Log the decision's events with its checkpoint; None once they are, else what
        `_execute` returns (the decision did not happen here). Whatever path it takes,
        it is one write (`write_id`): after Redis lost the run, its events alone are
        logged under that id, and its end tried through an outage is that write again."""
        write_id = "" if write is None else write.write_id
        while True:
            try:
                if write is None:  # claimed again: the checkpoint is written, now the events
                    return await self._publish(publish, decision, peer, None, write_id)
                async with self.lease.lock:  # one write of the lease at a time (parts count)
                    return await self._publish(publish, decision, peer, write)
            except LeaseNotHeld:
                # Another instance took the run over while this one stalled (the decision
                # is not this instance's to commit: the input goes to the new owner), or
                # Redis lost the run, which `announce` claims again; then the events.
                self.lease.announcing = None
                if write is None or not await self.lease.announce(decision.state):
                    return Then(LeaseLost())
                write = None

    async def _publish(self, publish: Publish, decision: Decision, peer: Peer | None,
                       write: DecisionWrite | None, write_id: str = "") -> Outcome:
        """`write_id`: the decision's write whose checkpoint was refused (`_commit`).
        May run under the lease's lock: what ends the run is returned (`Then`)."""
        if decision.refusable:
            with same_write(write_id):
                problem = await try_publish(self.log, publish.events, self.log_extra, write)
            return None if problem is None else self._refused(problem, decision, peer)
        try:
            with same_write(write_id):
                await publish_retrying(self.log, publish.events,
                                       self.env.settings.run_lease_s / 2, self.log_extra, write)
            return None
        except PublishFailed as failed:
            self.lease.announcing = None
            if isinstance(failed.cause, BackendUnavailable) and self.env.registry.remote:
                return await self._through_outage(publish, decision, peer, write, write_id)
            return self._not_logged(failed, decision)

    async def _through_outage(self, publish: Publish, decision: Decision, peer: Peer | None,
                              write: DecisionWrite | None, write_id: str) -> Outcome:
        """The decision (the run's end, or a running run's: a `tool.call`, a takeover's
        `run.resumed`) was not logged within half a lease: Redis is away. Its sender (a
        `run.cancel`'s) is told `unavailable` now, and the decision is tried again with
        its checkpoint under the same write id (logged once however many attempts reach
        Redis) while only this instance may write it (the lease check is in the same
        step), for up to `OUTAGE_RETRY_LEASES` leases. None once logged: the decision's
        other effects follow (a `Release`, a timer, the next model turn; no second
        answer). `LeaseNotHeld` when another instance took the run over meanwhile
        (`_commit`: it goes on there; `Then(LeaseLost())` when no write was in hand).
        `Then(LeaseLost())` after that time (applied once the lease's lock is free): the
        run is let go here unfreed, and whoever takes it over goes on from its
        checkpoint (the client was told to retry), or frees it if the end did reach
        Redis. An end used to be given up after half a lease, its sender not answered,
        and this instance's own janitor took the run "over", lacking the end: a
        `run.cancel` was lost and the run waited on its call again; a running run's
        decision ended the run `failed` `internal_error` (the chaos soak's Redis pauses).
        After Redis lost the run (no `write` in hand) the events went as a plain group,
        then here under another write id: an append whose reply was lost logged them
        twice. The write here is the decision's first (`write_id`, whose ids the group
        used; an unfenced decision gets one too, `_log_decision`)."""
        self.waits_out_outage = True  # messages about the run are answered `unavailable`
        logger.warning("a decision of the run could not be logged within half a lease; "
                       "retrying it through the outage", extra=self.log_extra)
        if peer is not None:
            self.answered = peer
            peer.reply(Error(code=ErrorCode.UNAVAILABLE, message="the shared backend is "
                             "unavailable; retry shortly", reply_to=decision.reply_to,
                             run_id=self.run_id, retry_after_ms=1000))
        if self._current is not None:  # the sender's connection goes on meanwhile
            self._current.settle(True)
        try:
            self.lease.announcing = decision.state  # no renewal undoes the checkpoint
            if write is not None:  # `_commit` holds the lease's lock
                await self._retry_through(publish, write)
                return None
            async with self.lease.lock:  # unfenced, or claimed again after Redis lost the run
                again = self.lease.decision_write(decision.state)
                again.write_id = write_id or again.write_id
                await self._retry_through(publish, again)
            return None
        except LeaseNotHeld:
            if write is not None:
                raise  # `_commit` looks into it (Redis lost the run: claimed again)
            self.lease.announcing = None
            return await self._claimed_again(publish, decision, write_id)
        except PublishFailed as failed:
            self.lease.announcing = None
            logger.error("a decision of the run could not be logged (%s); its lease lapses "
                         "and whoever takes the run over goes on", failed.why,
                         extra=self.log_extra)
            return Then(LeaseLost())
        finally:
            self.waits_out_outage = False

    async def _claimed_again(self, publish: Publish, decision: Decision, write_id: str
                             ) -> Outcome:
        """The lease was not held when the outage ended: another instance took the run
        over (it goes on there), or Redis lost the run (a failover to a replica that
        lacked it), which is claimed again, as `_commit` does, and the decision's events
        are then logged under its write id. Letting the run go in that second case left
        it on no instance and in no record: no `run.finished`, ever."""
        try:
            if not await self.lease.announce(decision.state):
                return Then(LeaseLost())
            with same_write(write_id):
                await self._retry_through(publish, None)
            return None
        except (PublishFailed, BackendUnavailable, LeaseNotHeld) as failed:
            logger.error("a decision of the run could not be logged after Redis lost the "
                         "run (%s); whoever takes the run over goes on",
                         failed.why if isinstance(failed, PublishFailed) else repr(failed),
                         extra=self.log_extra)
            return Then(LeaseLost())

    async def _retry_through(self, publish: Publish, write: DecisionWrite | None) -> None:
        await publish_retrying(self.log, publish.events, self.env.settings.run_lease_s
                               * OUTAGE_RETRY_LEASES, self.log_extra, write)
