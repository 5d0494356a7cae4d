"""Several runs asked for at once (PROTOCOL.md section 12): the queue and interrupts.

`if_busy: enqueue` puts a `run.start` in the document's queue (shared by every
instance through the registry) while another client's run is active or runs
already wait; it is announced as `run.queued` and acked `queued`. When the
active run ends, the instance where it ended starts the next queued run (its
events reach the starter wherever it is connected; decided: no hand-over to
the starter's own instance). `if_busy: interrupt` ends the other client's run
`cancelled`/`interrupted` and starts this one. `run.cancel` of a queued run
ends it with `run.finished` `cancelled`/`user_cancelled`, `steps: 0`.

A queued run whose start cannot be announced when its turn comes (the backend
is unavailable, or its `run.started` cannot be logged) is out of the queue and
never started: it ends `failed` with that error's code as `reason` (mostly
`unavailable`), `steps: 0`, logged as soon as the backend takes it, and only
then does the next queued run get its turn. While the queue cannot be read the
instance looks again every second, so queued runs start once the backend is
back even if nothing else happens on the document (decided in README).
"""

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

import orjson

from protocol.client import RunCancel, RunStart
from protocol.codes import ErrorCode
from protocol.server import Error, RunError, RunFinished, RunQueued, RunSnapshot
from server.agent.admission import workflow_of
from server.agent.environment import RunEnvironment
from server.agent.queue_edits import judge_waited
from server.agent.run_state import RunState
from server.agent.wire_events import Message
from server.backends.base import BackendUnavailable, UnloggableEvent, run_ended_in_log
from server.connection import Peer
from server.log_groups import LeaseNotHeld, new_write_id, one_write, same_write
from server.ports import EventLog

logger = logging.getLogger("cowrite.agent")
QUEUE_RETRY_S = 1.0  # a queue that could not be read is read again after this
UNSTARTED_RETRY_S = 300.0  # how long the end of a run that could not start is retried
UNSTARTED = "the queued run could not be started: the shared backend was unavailable; " \
    "start it again"
UNLOGGED_CANCEL = "the shared backend is unavailable; retry shortly"


@dataclass(eq=False)
class QueuedPeer:
    """The starter of a queued run when it starts: its identity; its replies (the ack
    of `run.start` was already sent as `queued`) go nowhere, but a refusal of the
    start is kept: it becomes the run's `run.finished` error."""

    document_id: str
    queued_user: str
    client_id: str
    session_id: str = ""
    refusal: RunError | None = None

    @property
    def user_id(self) -> str:
        return self.queued_user

    def reply(self, message: Message) -> None:
        if isinstance(message, Error):
            self.refusal = RunError(code=message.code, message=message.message)

    def error(self, code: ErrorCode, message: str, **fields: Any) -> None:
        self.refusal = RunError(code=code, message=message)

    def ack(self, reply_to: str | None, **fields: Any) -> None:
        return None


def _failed(entry: dict[str, Any], refusal: RunError | None) -> RunFinished:
    error = refusal or RunError(code=ErrorCode.UNAVAILABLE, message=UNSTARTED)
    if error.code == ErrorCode.UNAVAILABLE:
        error = RunError(code=error.code, message=UNSTARTED)
    return RunFinished(run_id=str(entry["run_id"]), status="failed", reason=error.code,
                       error=error, steps=0)


class RunQueueMixin:
    """Queue handling of `RunCoordinator` (which provides these attributes)."""

    document_id: str
    env: RunEnvironment
    log: EventLog
    _start_lock: asyncio.Lock
    _kicks: set["asyncio.Task[None]"]
    _cancelling: set[str] | None = None  # set on first use (`_cancels`)

    @property
    def busy(self) -> bool:
        raise NotImplementedError

    async def _new_state(self, peer: Peer, message: RunStart) -> RunState:
        raise NotImplementedError

    async def _launch(self, state: RunState, peer: Peer, message: RunStart,
                      release: bool = True) -> bool:
        raise NotImplementedError

    async def _enqueue(self, peer: Peer, message: RunStart) -> None:
        settings, registry = self.env.settings, self.env.registry
        run_id = message.run_id or f"run_{uuid.uuid4().hex[:16]}"
        head = await registry.head(self.document_id)  # edits after it: see queue_edits
        workflow = workflow_of(message, self.env)  # its mode is the run's (snapshots show it)
        entry = {"run_id": run_id, "user_id": peer.user_id, "client_id": peer.client_id,
                 "mode": workflow.mode if workflow is not None else message.mode,
                 "message": message.model_copy(
                     update={"run_id": run_id}).to_wire(), "since": [head.epoch, head.last_seq]}
        position = await registry.enqueue_run(self.document_id, entry,
                                              settings.max_queued_runs)
        if position is None:
            peer.error(ErrorCode.DOCUMENT_BUSY, f"at most {settings.max_queued_runs} runs may "
                       "wait on this document", reply_to=message.id)
            return
        await registry.put_run_record(self.document_id, run_id, {
            "status": "queued", "user_id": peer.user_id, "client_id": peer.client_id})
        await self.log.publish_many([RunQueued(run_id=run_id, user_id=peer.user_id,
                                               client_id=peer.client_id, prompt=message.prompt,
                                               position=position)])
        peer.ack(message.id, run_id=run_id, status="queued")
        self.kick()  # the active run may have ended meanwhile

    def kick(self) -> None:
        """Start the next queued run soon, if the document is free."""
        self._track(self.start_queued())

    async def start_queued(self) -> None:
        registry, lease = self.env.registry, self.env.settings.run_lease_s
        async with self._start_lock:
            if self.busy or self.env.draining:
                return
            try:
                waiting = await registry.queued_runs(self.document_id)
                if not waiting:
                    return
                entry = waiting[0]
                message = RunStart.model_validate(entry["message"])
                peer = QueuedPeer(self.document_id, str(entry["user_id"]),
                                  str(entry["client_id"]))
                state = await self._new_state(peer, message)
                holder = await registry.claim_run(
                    self.document_id, state.to_record(self.env.instance_id), lease)
                if holder is not None:
                    return  # another run holds the document; its end kicks the queue
                if await registry.remove_queued(self.document_id, state.run_id) is None:
                    await registry.release_run(self.document_id, state.run_id,
                                               self.env.instance_id)
                    return  # cancelled (or started elsewhere) meanwhile
                caught_up = judge_waited(state, await self._waited(entry))
                if caught_up is None:  # a person's edit meanwhile ends it, as if it ran
                    self._track(self._end_unstarted(entry, RunFinished(
                        run_id=state.run_id, status="aborted", reason="document_changed",
                        steps=0), state.to_record(self.env.instance_id)))
                    return
                state = caught_up
            except BackendUnavailable:
                logger.warning("the run queue could not be read: backend unavailable",
                               extra={"document_id": self.document_id})
                self._kick_later(QUEUE_RETRY_S)
                return
            try:  # the document is held until its end is logged (`_end_unstarted`)
                started = await self._launch(state, peer, message, release=False)
            except BackendUnavailable:
                started, peer.refusal = False, None
            if not started:  # out of the queue, never announced: it must still end
                self._track(self._end_unstarted(entry, _failed(entry, peer.refusal),
                                                state.to_record(self.env.instance_id)))

    async def _waited(self, entry: dict[str, Any]) -> list[dict[str, Any]] | None:
        """The `document.changed` events logged since the run was queued (None: the log
        no longer holds them all); none known for an entry queued without `since`."""
        since = entry.get("since")
        if not isinstance(since, list) or len(since) != 2:
            return []
        logged = await self.env.registry.read_after(self.document_id, str(since[0]),
                                                    int(since[1]))
        if not isinstance(logged, list):
            return None
        return [orjson.loads(event.frame) for event in logged
                if event.type == "document.changed"]

    def _kick_later(self, delay_s: float) -> None:
        if not self.env.draining:
            asyncio.get_running_loop().call_later(delay_s, self.kick)

    def _track(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._kicks.add(task)
        task.add_done_callback(self._kicks.discard)

    async def _end_unstarted(self, entry: dict[str, Any], ended: RunFinished,
                             claim: dict[str, Any]) -> None:
        """`ended` (`steps: 0`) for a queued run that did not start: `failed` when its
        start could not be announced, `aborted` when an edit while it waited ended it;
        logged once the backend takes it, its record written, and only then the document
        it still holds freed: freed first, another instance's stalled-queue pass could
        start the next queued run, whose `run.started` clients then saw before this
        `run.finished`. Then the next queued run's turn. With a shared log the end is
        written with a renewal of the claim's lease (`claim`: the record it wrote), only
        while this instance still holds it: retried through an outage longer than a
        lease, it was logged after a janitor had taken the lapsed claim and ended the
        run itself (`server_lost`), two `run.finished`; now whoever holds it ends it."""
        run_id = str(entry["run_id"])
        fence = _ClaimFence({**claim, "write": new_write_id()},
                            self.env.settings.run_lease_s) if self.log.remote else None
        with one_write(self.log.remote):  # every attempt one write: a lost reply, retried,
            ended_ok = await self._end_unstarted_retrying(entry, ended, run_id, fence)
        if ended_ok is None:
            return  # taken over (its lease lapsed): the taker ended it and frees it
        with contextlib.suppress(BackendUnavailable):  # (given up: freed all the same; if
            await self.env.registry.release_run(  # this fails too, its lease lapses and
                self.document_id, run_id, self.env.instance_id)  # a janitor frees it)
        if ended_ok:
            self.env.metrics.runs.labels(ended.status).inc()
            self.kick()

    async def _end_unstarted_retrying(self, entry: dict[str, Any], ended: RunFinished,
                                      run_id: str, fence: "_ClaimFence | None"
                                      ) -> bool | None:
        """Whether `ended` was logged and recorded (tried again through an outage); None
        when another instance took the claim (its lease lapsed) before it was."""
        delay, deadline = QUEUE_RETRY_S / 8, time.monotonic() + UNSTARTED_RETRY_S
        while True:
            try:
                await self.log.publish_many([ended], fence)
                await self.env.registry.put_run_record(self.document_id, run_id, {
                    "status": ended.status, "user_id": entry["user_id"],
                    "client_id": entry["client_id"]})
                return True
            except BackendUnavailable:
                if time.monotonic() > deadline:
                    logger.error("queued run %s could not be started nor ended: backend "
                                 "unavailable", run_id, extra={"document_id": self.document_id})
                    return False
                await asyncio.sleep(delay)
                delay = min(delay * 2, QUEUE_RETRY_S * 4)
            except UnloggableEvent:  # cannot happen for these fields; never loop on it
                logger.exception("queued run %s could not be ended", run_id)
                return False
            except LeaseNotHeld:
                logger.warning("queued run %s was ended by the instance that took its "
                               "lapsed claim", run_id, extra={"document_id": self.document_id})
                return None

    async def _cancel_queued(self, peer: Peer, message: RunCancel) -> bool:
        """True when `message` was about a queued run (and is answered). Once its removal
        from the queue is sent, the run's end is owed: through an outage it is logged
        once Redis is back (`_cancel_through_outage`) and the sender told `unavailable`.
        The run used to vanish: out of the queue, never started nor ended, and the
        sender's retry was told it "is queued"."""
        registry, run_id = self.env.registry, message.run_id
        if run_id in self._cancels():
            peer.error(ErrorCode.UNAVAILABLE, UNLOGGED_CANCEL, reply_to=message.id,
                       run_id=run_id, retry_after_ms=1000)
            return True
        waiting = await registry.queued_runs(self.document_id)
        entry = next((e for e in waiting if e.get("run_id") == run_id), None)
        if entry is None:
            return False
        if entry.get("user_id") != peer.user_id:
            peer.error(ErrorCode.FORBIDDEN, "only the run's user may cancel it",
                       reply_to=message.id, run_id=run_id)
            return True
        ended = RunFinished(run_id=run_id, status="cancelled", reason="user_cancelled",
                            steps=0)
        write_id = new_write_id() if self.log.remote else ""
        removed = logged = False
        try:
            if await registry.remove_queued(self.document_id, run_id) is None:
                return False  # it started meanwhile: cancel it as a run
            removed = True
            await self._log_end(ended, write_id)
            logged = True
            await self._record_end(entry, ended)
        except BackendUnavailable:  # its end is logged (once) when Redis is back
            self._cancels().add(run_id)
            self._track(self._cancel_through_outage(entry, ended, write_id, removed))
            if not logged:
                peer.error(ErrorCode.UNAVAILABLE, UNLOGGED_CANCEL, reply_to=message.id,
                           run_id=run_id, retry_after_ms=1000)
                return True
        else:
            self.env.metrics.runs.labels("cancelled").inc()
        peer.ack(message.id, run_id=run_id, status="cancelled")
        return True

    def _cancels(self) -> set[str]:
        """The queued runs whose cancel's end waits out an outage here."""
        if self._cancelling is None:
            self._cancelling = set()
        return self._cancelling

    async def _log_end(self, ended: RunFinished, write_id: str) -> None:
        with same_write(write_id), one_write(self.log.remote):  # a retry logs it once
            await self.log.publish_many([ended])

    async def _record_end(self, entry: dict[str, Any], ended: RunFinished) -> None:
        await self.env.registry.put_run_record(self.document_id, ended.run_id, {
            "status": ended.status, "user_id": entry["user_id"],
            "client_id": entry["client_id"]})

    async def _cancel_through_outage(self, entry: dict[str, Any], ended: RunFinished,
                                     write_id: str, removed: bool) -> None:
        """The cancel of a queued run, finished once Redis is back: its removal (unless
        known done), its end under the first attempt's write id, its record."""
        delay, deadline = QUEUE_RETRY_S / 8, time.monotonic() + UNSTARTED_RETRY_S
        try:
            while True:
                try:
                    if not removed and not await self._removed_by_cancel(ended.run_id):
                        return  # a start took it first: the sender's retry cancels the run
                    removed = True
                    await self._log_end(ended, write_id)
                    await self._record_end(entry, ended)
                    break
                except BackendUnavailable:
                    if time.monotonic() > deadline:
                        logger.error("the cancel of queued run %s could not be logged: "
                                     "backend unavailable", ended.run_id,
                                     extra={"document_id": self.document_id})
                        return
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, QUEUE_RETRY_S * 4)
        finally:
            self._cancels().discard(ended.run_id)
        self.env.metrics.runs.labels("cancelled").inc()

    async def _removed_by_cancel(self, run_id: str) -> bool:
        """Whether the run is out of the queue by its cancel, whose removal's reply was
        lost: removed now, or gone with no start nor end of its own. A start takes it
        from the queue holding the document (`start_queued`), or lets go at once."""
        registry = self.env.registry
        if await registry.remove_queued(self.document_id, run_id) is not None:
            return True
        for _ in range(3):
            active = await registry.active_run(self.document_id)
            if active is None or active.get("run_id") != run_id:
                break
            await asyncio.sleep(QUEUE_RETRY_S / 2)
        else:
            return False  # started
        record = await registry.get_run_record(self.document_id, run_id)
        if record is None or record.get("status") != "queued":
            return False  # it ran, or ended unstarted
        return await run_ended_in_log(registry, self.document_id, run_id) is None

    async def queued(self) -> list[RunSnapshot]:
        """`welcome.queued_runs`: the waiting runs, next first."""
        try:
            waiting = await self.env.registry.queued_runs(self.document_id)
        except BackendUnavailable:
            return []
        return [RunSnapshot(run_id=str(e["run_id"]), status="queued",
                            mode="chat" if e.get("mode") == "chat" else "agent",
                            user_id=str(e["user_id"]), client_id=str(e["client_id"]), step=0)
                for e in waiting]


class _ClaimFence:
    """A queued run's claim as a decision checkpoint (`log_groups.DecisionCheckpoint`):
    the run's end is appended in one Redis step with a renewal of the claim's lease,
    refused once another instance holds it. Its write id makes an attempt whose reply
    was lost write nothing the second time."""

    __slots__ = ("_lease_s", "_record")

    def __init__(self, record: dict[str, Any], lease_s: float) -> None:
        self._record, self._lease_s = record, lease_s

    def begin(self) -> tuple[dict[str, Any], float, None]:
        return self._record, self._lease_s, None

    def end(self, written: bool | None) -> None:
        """Refused shows as `LeaseNotHeld` from the append; nothing to keep here."""
