"""The janitor of `RunRouter` (server/agent/remote.py): every instance runs one.

A run whose lease lapsed (its owner died, or handed it over while draining) is
taken by exactly one survivor, which continues it from its checkpoint (section
13) or, when it has none or is older than the run timeout, ends it through the
same run machine as any other ending (`End` aborted / `server_lost`), so the
pending call gets its `tool.done` and the run its one `run.finished`. A run that
had ended (its owner died between logging `run.finished` and freeing the run) is
only freed, with nothing announced. Then what its previous owner left unread is
acted on. A document with runs queued and no active run gets its queue started
(section 12). A draining instance takes over nothing.
"""

import asyncio
import collections
import logging
from typing import Any

from server.agent.machine import RunMachine
from server.agent.takeover import end_orphan, let_go_if_ended
from server.agent.work import now_ms
from server.backends.base import Backend, BackendUnavailable, cancel_requested
from server.observability import Metrics
from server.session_hub import SessionHub

logger = logging.getLogger("cowrite.remote")
_Entry = tuple[str, dict[str, Any]]  # an inbox entry: its id, the message


def janitor_interval(lease_s: float, most_s: float) -> float:
    """How often a janitor looks for lapsed leases: a quarter lease, at most `most_s`
    (`COWRITE_JANITOR_INTERVAL_S`, 0.5 s). A dead owner's lease lapses 2/3 to 1 lease
    after its last renewal (every third of a lease), so its run is taken over within a
    lease and `most_s`, plus the takeover's own work: PROTOCOL section 13's "within
    lease + 1 s". A quarter of the default 10 s lease alone (2.5 s) broke it, and a
    drained instance's runs waited as long for a survivor."""
    return max(0.05, min(lease_s / 4, most_s))


class JanitorMixin:
    """Takeovers and stalled queues of `RunRouter` (which provides these)."""

    backend: Backend
    hub: SessionHub
    machine: RunMachine
    metrics: Metrics
    me: str
    lease_s: float
    janitor_interval_s: float
    run_timeout_s: float
    durable: bool
    draining: bool
    _held: dict[str, collections.deque[_Entry]]
    _claimed: asyncio.Event

    async def _replay(self, owner: str, document_id: str, run_id: str) -> None:
        raise NotImplementedError

    async def _release(self, document_id: str) -> None:
        raise NotImplementedError

    def _runs_here(self, document_id: str, run_id: str) -> bool:
        raise NotImplementedError

    async def _janitor_loop(self) -> None:
        interval = self.janitor_interval_s
        while not cancel_requested():
            await asyncio.sleep(interval)
            if self.draining:  # its runs go to others; it takes none of theirs
                continue
            try:
                await self.backend.heartbeat(self.me, self.lease_s * 2)
                lapsed = await self._claim_lapsed()
            except BackendUnavailable:
                continue
            except Exception:
                logger.exception("claiming lapsed runs failed")
                continue
            for document_id, record in lapsed:
                try:
                    await self._go_on_with(document_id, record)
                except BackendUnavailable:
                    pass
                except Exception:
                    logger.exception("ending a lost run failed")
                finally:
                    await self._release(document_id)
            await self._start_stalled_queues()

    async def _claim_lapsed(self) -> list[tuple[str, dict[str, Any]]]:
        """Take the lapsed leases this instance gets (`expired_runs`); what is sent about
        those runs from now on is held until their takeover is done (`_held`)."""
        self._claimed.clear()
        try:
            lapsed = await self.backend.expired_runs(self.me, self.lease_s)
            for document_id, _ in lapsed:
                self._held.setdefault(document_id, collections.deque())
            return lapsed
        finally:
            self._claimed.set()

    async def _go_on_with(self, document_id: str, record: dict[str, Any]) -> None:
        """A run whose lease this instance claimed: taken over or ended, then what its
        previous owner left unread is acted on. One this instance drives is left alone:
        its lease lapsed (Redis was away) and came back to its owner."""
        run_id = str(record.get("run_id"))
        if not self._runs_here(document_id, run_id):
            if not await self._take_over(document_id, record):
                await self._end_orphan(document_id, record)
            await self._replay(str(record.get("owner")), document_id, run_id)

    async def _take_over(self, document_id: str, record: dict[str, Any]) -> bool:
        """Go on with a run whose owner died, from its checkpoint (section 13); False
        when it has none or is older than the run timeout (then it ends server_lost).
        A run whose end its owner logged before dying is only freed (nothing announced:
        it used to come back, `run.resumed`, and end twice)."""
        if await let_go_if_ended(self.backend, self.me, document_id, record):
            await self._start_queued(document_id)
            return True
        checkpoint = record.get("checkpoint") or {}
        started = int(checkpoint.get("started_ms") or 0)
        if not self.durable or not started or now_ms() - started > self.run_timeout_s * 1000:
            return False
        session = self.hub.get(document_id)
        try:
            return await session.runs.adopt(record, "handoff" if record.get("handoff")
                                            else "owner_lost")
        except Exception:
            logger.exception("taking over run %s failed", record.get("run_id"))
            return False
        finally:
            self.hub.release(session)

    async def _end_orphan(self, document_id: str, record: dict[str, Any]) -> None:
        await end_orphan(self.backend, self.machine, self.metrics, self.me, document_id,
                         record)
        await self._start_queued(document_id)

    async def _start_queued(self, document_id: str) -> None:
        session = self.hub.get(document_id)  # its queued runs may start now
        try:
            await session.runs.start_queued()
        finally:
            self.hub.release(session)

    async def _start_stalled_queues(self) -> None:
        """Queues whose document has no active run: the instance where a run ends starts
        the next one, but not while it shuts down, nor after it died (the queue waited
        for the next `run.start`; for ever after a lone instance's restart)."""
        try:
            stalled = await self.backend.stalled_queues(self.lease_s)
        except BackendUnavailable:
            return
        for document_id in stalled:  # one failing is looked at again later, not the rest
            try:
                await self._start_queued(document_id)
            except BackendUnavailable:
                pass
            except Exception:
                logger.exception("starting a stalled run queue failed",
                                 extra={"document_id": document_id})
