"""The commit point of a run driver's decision: logging its `Publish` group.

With Redis, a decision that announces something is checkpointed first (a
survivor must know every call its clients were told of). The checkpoint and
the events are written in one atomic step (`renew_and_append`): an owner
killed between two separate writes left a checkpoint whose events were never
logged (a `tool.call` nobody saw; after a takeover the call timed out).
A refusable decision (a client's `tool.result` or `approval`, the start) is
tried once and its sender answered on failure; any other is committed already
and retried through an outage (`publishing.py`). Kept apart from driver.py,
which holds the order of effects.
"""

import logging
from typing import Any

from protocol.codes import ErrorCode
from protocol.server import Error
from server.agent.environment import RunEnvironment
from server.agent.lease import DecisionWrite, RunLease
from server.agent.publishing import PublishFailed, publish_retrying, try_publish
from server.agent.run_state import RunState
from server.agent.steps import Crashed, Decision, Input, LeaseLost, Publish
from server.backends.base import BackendUnavailable
from server.connection import Peer
from server.log_groups import LeaseNotHeld
from server.ports import EventLog

logger = logging.getLogger("cowrite.agent")


class CommitMixin:
    """Of `RunDriver` (which provides these attributes)."""

    env: RunEnvironment
    log: EventLog
    lease: RunLease
    state: RunState
    _released: bool

    @property
    def run_id(self) -> str:
        return self.state.run_id

    @property
    def log_extra(self) -> dict[str, Any]:
        return {"run_id": self.state.run_id, "document_id": self.state.document_id}

    async def _apply(self, event: Input, peer: Peer | None, sent: Any = None) -> bool:
        raise NotImplementedError

    async def _commit(self, publish: Publish, decision: Decision, peer: Peer | None,
                      write: DecisionWrite | None) -> bool | None:
        """Log the decision's events with its checkpoint; None once they are, else what
        `_execute` returns (the decision did not happen here)."""
        while True:
            try:
                if write is None:  # claimed again: the checkpoint is written, now the events
                    return await self._publish(publish, decision, peer, None)
                async with self.lease.lock:  # one write of the lease at a time (parts count)
                    return await self._publish(publish, decision, peer, write)
            except LeaseNotHeld:
                # Another instance took the run over while this one stalled (the decision
                # is not this instance's to commit: the input goes to the new owner), or
                # Redis lost the run, which `announce` claims again; then the events.
                self.lease.announcing = None
                if write is None or not await self.lease.announce(decision.state):
                    await self._apply(LeaseLost(), None)
                    return False
                write = None

    async def _publish(self, publish: Publish, decision: Decision, peer: Peer | None,
                       write: DecisionWrite | None) -> bool | None:
        if decision.refusable:
            problem = await try_publish(self.log, publish.events, self.log_extra, write)
            if problem is None:
                return None
            self.lease.announcing = None
            if peer is not None:
                peer.reply(Error(code=problem[0], message=problem[1],
                                 reply_to=decision.reply_to, run_id=self.run_id,
                                 retry_after_ms=1000 if problem[0] == ErrorCode.UNAVAILABLE
                                 else None))
            return False
        try:
            await publish_retrying(self.log, publish.events,
                                   self.env.settings.run_lease_s / 2, self.log_extra, write)
            return None
        except PublishFailed as failed:
            self.lease.announcing = None
            if not decision.state.finished:
                return await self._apply(Crashed(failed.ref), None)
            logger.error("the run's end could not be logged (%s)", failed.why,
                         extra=self.log_extra)
            self._released = isinstance(failed.cause, BackendUnavailable)
            self.state = decision.state
            return True  # with Redis the lease lapses and a survivor announces it
