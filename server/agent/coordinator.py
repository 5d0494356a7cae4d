"""The runs of one document on this instance: admission and routing.

`run.start` is admitted here (idempotency, tool schemas, allowed models,
busy document, rate limit, supersede) and becomes a `RunDriver` once the
document is claimed. Start is transactional: anything that fails before
`run.started` is logged refuses the `run.start` and frees the claim; after
it, the driver ends the run itself. Messages about a run go to its driver
(or, when another instance owns it, to that instance); a finished run
answers through the same machine, so late messages get `run_not_active`.
"""

import asyncio
import contextlib
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from protocol.client import Approval, ClientMessage, EditorChange, RunCancel, RunStart, ToolResult
from protocol.codes import ErrorCode
from protocol.server import FinishedStatus, RunSnapshot
from server.agent.admission import first_state, refusal, toolbox_for
from server.agent.claim import claim_document, refuse_held, run_ending, unless_ended
from server.agent.client_inputs import client_input
from server.agent.driver import RunDriver
from server.agent.edits import edit_key
from server.agent.environment import RunEnvironment
from server.agent.run_queue import RunQueueMixin
from server.agent.run_state import TERMINAL, RunState
from server.agent.steps import (
    DocumentEdited,
    End,
    ExecutorPresence,
    Reply,
)
from server.agent.takeover import TakeoverMixin
from server.backends.base import BackendUnavailable, run_ended_in_log
from server.connection import Peer
from server.ports import EventLog, LocalPresence

logger = logging.getLogger("cowrite.agent")
FINISHED_RUNS_KEPT = 256
# An edit's owner lookup through an outage: tried again this long at most (each edit
# holds its connection's later messages as long; half a lease, 5 s, was too long)
EDIT_LOOKUP_RETRY_S = 2.0


class RunCoordinator(RunQueueMixin, TakeoverMixin):
    def __init__(self, document_id: str, log: EventLog, local: LocalPresence,
                 env: RunEnvironment, on_idle: Callable[[], None] = lambda: None) -> None:
        self.document_id = document_id
        self.log = log
        self.local = local
        self.env = env
        self._on_idle = on_idle
        self.active: RunDriver | None = None
        self.finished: OrderedDict[str, RunState] = OrderedDict()
        # runs whose `run.finished` this instance fanned out (of any owner), see `snapshot`
        self._seen_ended: OrderedDict[str, None] = OrderedDict()
        self._start_lock = asyncio.Lock()
        self._kicks: set[asyncio.Task[None]] = set()

    # -- what the session asks ------------------------------------------------------
    @property
    def busy(self) -> bool:
        return self.active is not None

    def drives(self, run_id: str) -> bool:
        """Whether this instance's driver runs `run_id` now."""
        return self.active is not None and self.active.run_id == run_id

    async def snapshot(self, for_user: str | None = None) -> RunSnapshot | None:
        """The active run, whichever instance runs it (tokens only for its user)."""
        driver = self.active
        if driver is not None and not driver.state.finished:
            # A decision being written (Redis): its events may be in the log already (a
            # welcome reads the head first) while `state` waits for the write's reply; a
            # resumed client then saw a replayed `tool.call` that `pending` lacked.
            writing = driver.lease.announcing
            return (writing if writing is not None and not writing.finished
                    else driver.state).snapshot(for_user)
        record = await self._remote_record()
        if record is None or record.get("run_id") in self._seen_ended or \
                record.get("status") in TERMINAL:  # its end is logged, its release not yet
            return None
        # Its `run.finished` may be logged already and not yet come through pub/sub
        # (the owner frees the record just after): then the log says so.
        with contextlib.suppress(BackendUnavailable):
            if await run_ended_in_log(self.env.registry, self.document_id,
                                      str(record.get("run_id"))) is not None:
                self.saw_run_end(str(record.get("run_id")))
                return None
        fields = {k: v for k, v in record.items() if k in RunSnapshot.model_fields}
        if for_user != record.get("user_id"):
            fields["pending"] = [{k: v for k, v in item.items() if k != "token"}
                                 for item in fields.get("pending", [])]
        return RunSnapshot.model_validate(fields)

    def saw_run_end(self, run_id: str) -> None:
        """A `run.finished` passed through this instance's fan-out. Its owner frees the
        run's record only after logging it, so a tab that joins here in between (after
        another tab here was told the run ended) must not be shown the run as active."""
        self._seen_ended[run_id] = None
        while len(self._seen_ended) > FINISHED_RUNS_KEPT:
            self._seen_ended.popitem(last=False)

    def presence_changed(self) -> None:
        driver = self.active
        if driver is not None:
            state = driver.state
            driver.feed(ExecutorPresence(self.local.has_client(state.user_id, state.client_id)))

    async def on_edit(self, peer: Peer, message: EditorChange, forwarded: bool = False
                      ) -> None:
        """An `editor.change`: the run decides (section 11); an edit of a run owned by
        another instance goes to its owner, in order (`RunRouter.post_to_run_owner`), the
        run's own too (origin `agent`: dropped, they left its scope behind its text).
        Asked again when the run came here while its owner was looked up (a takeover).
        Redis away for the lookup: tried for up to 2 s, then `BackendUnavailable` (a
        person's edit: `unavailable` before anything is done, so its client sends it
        again under its `id`: applied once); at once while the local run's decision waits
        out an outage (`commit.py`: the lookup found the run here once Redis was back and
        the edit was dropped unanswered). One forwarded here waits for that decision."""
        for _ in range(2):
            driver = self.active
            if not forwarded and driver is not None and not driver.state.finished and \
                    self.env.cluster.has_lane(self.document_id):  # the run moved here while
                # this instance still forwards edits made before, or takes it over (the
                # previous owner's are replayed first): this one goes behind them
                self._forward_edit(driver.run_id, peer, message)
                return
            if driver is not None and not driver.state.finished and \
                    (forwarded or not driver.waits_out_outage):
                if await self._submit_edit(driver, peer, message):
                    return
                await driver.done.wait()  # it ended, or moved to another instance: ask there
            elif driver is not None and not driver.state.finished:  # (the lookup below
                raise BackendUnavailable("the run waits out an outage")  # dropped it)
            try:
                record = await self._record_elsewhere()
            except BackendUnavailable:
                if not forwarded:
                    raise
                logger.warning("an edit forwarded here found no run to tell: the backend "
                               "is away", extra={"document_id": self.document_id})
                return
            if record is not None:
                self._forward_edit(str(record["run_id"]), peer, message)
                return
            if self.active is driver:  # no run to tell
                return

    async def _submit_edit(self, driver: RunDriver, peer: Peer, message: EditorChange
                           ) -> bool:
        """Whether the local run dealt with the edit (False: it ended or moved on first)."""
        started = time.perf_counter()
        changes = None if message.changes is None else tuple(
            (c.from_, c.to, c.insert) for c in message.changes)
        edited = DocumentEdited(peer.user_id, message.origin, message.document_version,
                                message.summary, changes,
                                edit_key(peer.client_id, message.to_wire()))
        if not await driver.submit(edited):
            return False
        if driver.state.finished:
            self.env.metrics.abort_latency.observe(time.perf_counter() - started)
        return True

    def _forward_edit(self, run_id: str, peer: Peer, message: EditorChange) -> None:
        self.env.cluster.post_to_run_owner(self.document_id, run_id, {
            "kind": "edit", "document_id": self.document_id, "run_id": run_id, "user_id":
            peer.user_id, "client_id": peer.client_id, "message": message.to_wire()})

    async def abort(self, run_id: str, status: FinishedStatus, reason: str) -> None:
        """End the local run `run_id` (asked by another instance). After an interrupt the
        interrupter claims the document next, not this instance's queue (which took it
        first, and the interrupter was refused); a janitor starts the queue if it does not."""
        driver = self.active
        if driver is not None and driver.run_id == run_id:
            driver.kicks_queue = reason != "interrupted"
            await driver.submit(End(status, reason))

    async def shutdown(self) -> None:
        driver = self.active
        if driver is not None:
            await driver.submit(End("aborted", "server_shutdown"))
            await driver.done.wait()

    # -- client messages ------------------------------------------------------------
    async def handle(self, peer: Peer, message: ClientMessage, forwarded: bool = False) -> None:
        if isinstance(message, RunStart):
            if not forwarded:
                async with self._start_lock:
                    await self._start(peer, message)
            return
        if not isinstance(message, (ToolResult, Approval, RunCancel)):
            return
        if not forwarded and self.env.cluster.has_lane(self.document_id) and \
                await self.env.cluster.to_run_owner(  # behind the edits on their way
                    self.document_id, message.run_id, self.env.cluster.envelope(peer, message),
                    peer):
            return
        driver = self.active
        if driver is not None and driver.run_id == message.run_id:
            if driver.waits_out_outage:  # a decision waits out an outage: do not wait with it
                peer.error(ErrorCode.UNAVAILABLE, "the shared backend is unavailable; retry "
                           "shortly", reply_to=message.id, run_id=message.run_id,
                           retry_after_ms=1000)
                return
            if await driver.submit(client_input(driver, peer, message), peer):
                return
        finished = self.finished.get(message.run_id)
        if finished is not None:
            for effect in self.env.machine.decide(finished, client_input(None, peer, message)
                                                  ).effects:
                if isinstance(effect, Reply):  # only replies come out of `finished`
                    peer.reply(effect.message)
            return
        if isinstance(message, RunCancel) and await self._cancel_queued(peer, message):
            return
        if self.env.registry.remote and await self.env.cluster.to_run_owner(
                self.document_id, message.run_id, self.env.cluster.envelope(peer, message),
                peer):
            return  # the run lives on (or is moving to) another instance
        if record := await self.env.registry.get_run_record(self.document_id, message.run_id):
            state = "is queued: it has not started" if record.get("status") == "queued" \
                else "has finished"
            peer.error(ErrorCode.RUN_NOT_ACTIVE, f"run {message.run_id!r} {state}",
                       reply_to=message.id, run_id=message.run_id)
        else:
            peer.error(ErrorCode.RUN_NOT_FOUND, f"no run {message.run_id!r} on this document",
                       reply_to=message.id, run_id=message.run_id)

    # -- starting a run -------------------------------------------------------------
    async def _start(self, peer: Peer, message: RunStart) -> None:
        env, settings = self.env, self.env.settings
        if message.run_id is not None:
            status = await self._known_status(message.run_id)
            if status is not None:
                peer.ack(message.id, run_id=message.run_id, status=status, duplicate=True)
                return
        problem = refusal(message, self.env)
        if problem is not None:
            peer.error(ErrorCode.INVALID_MESSAGE, problem[1], reply_to=message.id,
                       details=[{"loc": problem[0], "msg": problem[1]}])
            return
        active = await unless_ended(self.active)
        other = active is not None and (active.state.client_id != peer.client_id
                                        or active.state.user_id != peer.user_id)
        remote = None if active is not None else await self._remote_record()
        if remote is not None and (remote.get("run_id") in self._seen_ended
                                   or await run_ending(env.registry, self.document_id, remote)):
            remote = None  # it ended (its owner frees it next): `claim_document` waits
        other = other or (remote is not None and (remote.get("client_id") != peer.client_id
                                                  or remote.get("user_id") != peer.user_id))
        if_busy = message.options.if_busy if message.options else "reject"
        waiting = bool(await env.registry.queued_runs(self.document_id))
        if (other or waiting) and if_busy == "interrupt" and not settings.allow_interrupt:
            peer.error(ErrorCode.FORBIDDEN, "this server does not allow interrupting a run",
                       reply_to=message.id)
            return
        if other and if_busy == "reject":
            holder = active.run_id if active is not None else (remote or {}).get("run_id")
            peer.error(ErrorCode.DOCUMENT_BUSY,
                       f"run {holder!r} of another client is active on this document",
                       reply_to=message.id, run_id=holder)
            return
        if waiting and if_busy == "reject" and active is None and remote is None:
            # the document between a run's end and the queue's next start (or a queue
            # nobody started, until a janitor does): not a place ahead of runs told "next"
            peer.error(ErrorCode.DOCUMENT_BUSY, "runs are queued on this document: ask with "
                       "if_busy enqueue (or interrupt)", reply_to=message.id)
            return
        retry_after = await env.registry.take_run_slot(peer.user_id, settings.rate_runs_per_min)
        if retry_after:
            peer.error(ErrorCode.RATE_LIMITED, "too many runs started; wait before the next",
                       reply_to=message.id, retry_after_ms=retry_after)
            return
        if (other or waiting) and if_busy == "enqueue":
            await self._enqueue(peer, message)
            return
        if active is not None:  # the same client's run is superseded; another's interrupted
            ending = End("cancelled", "interrupted") if other else End("cancelled", "superseded")
            await active.submit(ending)
            await active.done.wait()
        elif remote is not None and other:  # interrupt the run on its owner
            self.env.cluster.post(str(remote["owner"]), {
                "kind": "interrupt", "document_id": self.document_id,
                "run_id": remote["run_id"]})
        try:
            state = await self._new_state(peer, message)
        except BackendUnavailable:
            raise
        except Exception:
            ref = uuid.uuid4().hex[:12]
            logger.exception("preparing a run failed (ref %s)", ref,
                             extra={"document_id": self.document_id})
            peer.error(ErrorCode.INTERNAL, f"internal error (ref {ref})", reply_to=message.id)
            return
        holder = await claim_document(self.env, self.document_id, state, peer,
                                      interrupting=other and if_busy == "interrupt")
        if holder is not None and holder.get("run_id") == state.run_id:  # a repeat: claimed,
            peer.ack(message.id, run_id=state.run_id, duplicate=True,  # not begun (its dead
                     status=str(holder.get("status") or "running"))  # owner's janitor ends it)
            return
        if holder is not None:
            await refuse_held(self.env, self.document_id, holder, peer, message.id)
            return
        await self._launch(state, peer, message)

    async def _known_status(self, run_id: str) -> str | None:
        if self.active is not None and self.active.run_id == run_id:
            return self.active.state.status
        if run_id in self.finished:
            return self.finished[run_id].status
        record = await self.env.registry.get_run_record(self.document_id, run_id)
        return None if record is None else str(record.get("status"))

    async def _new_state(self, peer: Peer, message: RunStart) -> RunState:
        earlier = await self.env.registry.read_history(self.document_id)
        state = first_state(message, self.env, peer.user_id, peer.client_id, earlier,
                            self.local.has_client(peer.user_id, peer.client_id))
        return state.evolve(document_id=self.document_id)

    async def _launch(self, state: RunState, peer: Peer, message: RunStart,
                      release: bool = True) -> bool:
        """Announce and run `state`; False when nothing could be announced (the claim is
        freed again unless not `release`: a queued run's, freed after its end is logged;
        `peer` was told why)."""
        registry = self.env.registry
        driver = RunDriver(state, self.env, self.log, toolbox_for(state, self.env), self._finished)
        self.active = driver
        accepted = False
        try:
            await registry.put_run_record(self.document_id, state.run_id, {
                "status": "running", "user_id": state.user_id, "client_id": state.client_id})
            accepted = await driver.start(peer, message.id)
        finally:
            if not accepted:  # nothing was announced: free the document again
                if self.active is driver:
                    self.active = None
                if release:
                    with contextlib.suppress(BackendUnavailable):
                        await registry.release_run(self.document_id, state.run_id,
                                                   self.env.instance_id)
        return accepted

    def _finished(self, driver: RunDriver) -> None:
        if driver.state.finished and driver.last_live_state is None:  # not one that moved on
            self.finished[driver.run_id] = driver.state
            while len(self.finished) > FINISHED_RUNS_KEPT:
                self.finished.popitem(last=False)
        if self.active is driver:
            self.active = None
        if driver.state.phase != "new" and driver.kicks_queue:  # a start never announced
            self.kick()  # kicks nothing: a queued one that failed ends first (run_queue.py)
        self._on_idle()

    async def _record_elsewhere(self) -> dict[str, Any] | None:
        """The document's active run when this instance is not running it: another
        instance owns it, or it is moving to one. Asked again while the backend is away,
        for up to `EDIT_LOOKUP_RETRY_S` (a blip is bridged), then `BackendUnavailable`."""
        loop, wait_s = asyncio.get_running_loop(), EDIT_LOOKUP_RETRY_S
        deadline, delay = loop.time() + min(self.env.settings.run_lease_s / 2, wait_s), 0.05
        while True:
            try:
                record = await self.env.registry.active_run(self.document_id)
                break
            except BackendUnavailable:
                if loop.time() + delay > deadline:
                    raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)
        if record is None:
            return None
        driver = self.active
        if driver is not None and driver.run_id == record.get("run_id") and \
                not driver.done.is_set():
            return None
        return record

    async def _remote_record(self, run_id: str | None = None) -> dict[str, Any] | None:
        """The document's active run if another instance owns it."""
        try:
            record = await self.env.registry.active_run(self.document_id)
        except BackendUnavailable:
            return None
        if record is None or record.get("owner") == self.env.instance_id:
            return None
        if run_id is not None and record.get("run_id") != run_id:
            return None
        return record
