"""Run ownership for one document session.

Routes `run.start`, `tool.result`, `approval` and `run.cancel`; aborts the
active run on a user edit; owns every way a run can end, so each run ends
with exactly one `run.finished`: `finish()` flips `run.finishing` before its
first await, later callers return at once, and events a finishing run still
tries to emit are dropped at `emit()`.
"""

import asyncio
import contextlib
import logging
import time
import uuid
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from protocol.client import Approval, ClientMessage, RunCancel, RunStart, ToolResult
from protocol.codes import ErrorCode
from protocol.server import (
    ApprovalResolved,
    DurableServerEvent,
    FinishedStatus,
    RunError,
    RunFinished,
    RunSnapshot,
    RunStarted,
    ToolDone,
)
from server.agent.dispatch import ApprovalAnswer, ToolDispatcher
from server.agent.history import assistant_entry, prompt_entry
from server.agent.llm import ModelError
from server.agent.loop import AgentLoop, Finish
from server.agent.state import (
    Accept,
    Duplicate,
    Refuse,
    Run,
    ToolOutcome,
    judge_tool_result,
    now_ms,
)
from server.agent.tools import BUILTIN_SERVER_TOOLS, CheckedCall, ToolBox, check_tool_schemas
from server.backends.base import BackendUnavailable
from server.connection import Connection, Peer

if TYPE_CHECKING:
    from server.services import Services
    from server.session import DocumentSession

logger = logging.getLogger("cowrite.agent")
FINISHED_RUNS_KEPT = 256
CALL_CLAIM_TTL_S = 3600.0


class RunCoordinator:
    def __init__(self, session: "DocumentSession", services: "Services") -> None:
        self.session = session
        self.services = services
        self.settings = services.settings
        self.active: Run | None = None
        self.finished: OrderedDict[str, Run] = OrderedDict()
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._grace: dict[str, asyncio.TimerHandle] = {}
        self._background: set[asyncio.Task[None]] = set()
        self._renewals: dict[str, asyncio.Task[None]] = {}
        self._start_lock = asyncio.Lock()
        self.dispatcher = ToolDispatcher(self)

    # -- session hooks ------------------------------------------------------------
    @property
    def busy(self) -> bool:
        return self.active is not None or bool(self._tasks)

    async def snapshot(self, for_user: str | None = None) -> RunSnapshot | None:
        """The active run, whichever instance runs it (tokens only for its user)."""
        run = self.active
        if run is not None and not run.finishing:
            return run.snapshot(for_user)
        record = await self._remote_record()
        if record is None:
            return None
        fields = {k: v for k, v in record.items() if k in RunSnapshot.model_fields}
        if for_user != record.get("user_id"):
            fields["pending"] = [{k: v for k, v in item.items() if k != "token"}
                                 for item in fields.get("pending", [])]
        return RunSnapshot.model_validate(fields)

    async def _remote_record(self, run_id: str | None = None) -> dict[str, Any] | None:
        """The document's active run if another instance owns it."""
        try:
            record = await self.services.backend.active_run(self.session.document_id)
        except BackendUnavailable:
            return None
        if record is None or record.get("owner") == self.services.instance_id:
            return None
        if run_id is not None and record.get("run_id") != run_id:
            return None
        return record

    def on_connection_joined(self, conn: Connection) -> None:
        if self.active is not None:
            self.update_grace(self.active)

    def on_connection_left(self, conn: Connection) -> None:
        if self.active is not None:
            self.update_grace(self.active)

    async def on_user_edit(self, conn: Connection) -> None:
        run = self.active
        if run is not None and not run.finishing:
            started = time.perf_counter()
            await self.finish(run, Finish("aborted", "document_changed"))
            self.services.metrics.abort_latency.observe(time.perf_counter() - started)
            return
        record = await self._remote_record()
        if record is not None:
            self.services.router.post(record["owner"], {
                "kind": "abort", "document_id": self.session.document_id,
                "run_id": record["run_id"]})

    async def abort(self, run_id: str, status: FinishedStatus, reason: str) -> None:
        """End the local run `run_id` (asked by another instance)."""
        run = self.active
        if run is not None and run.run_id == run_id and not run.finishing:
            await self.finish(run, Finish(status, reason))

    async def shutdown(self) -> None:
        if self.active is not None:
            await self.finish(self.active, Finish("aborted", "server_shutdown"))
        for task in list(self._tasks.values()):
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    # -- RunHost ----------------------------------------------------------------
    async def emit(self, run: Run, event: DurableServerEvent) -> None:
        """Publish an event of a live run; a finishing run emits nothing more."""
        if run.finishing:
            raise asyncio.CancelledError
        await self.session.publish(event)

    async def emit_delta(self, run: Run, delta: str) -> None:
        if run.finishing or run.message_id is None:
            raise asyncio.CancelledError
        await self.session.publish_delta(run.run_id, run.message_id, delta)

    async def remember(self, run: Run, entries: list[dict[str, Any]]) -> None:
        await self.services.backend.append_history(run.document_id, entries)

    async def run_tool(self, run: Run, call_id: str, call: CheckedCall) -> ToolOutcome:
        return await self.dispatcher.run_tool(run, call_id, call)

    # -- inbound ------------------------------------------------------------------
    async def handle(self, conn: Peer, message: ClientMessage, forwarded: bool = False) -> None:
        if isinstance(message, RunStart):
            if not forwarded:
                async with self._start_lock:
                    await self._start(conn, message)
            return
        if not isinstance(message, (ToolResult, Approval, RunCancel)):
            return
        if self._find(message.run_id) is None and not forwarded:
            record = await self._remote_record(message.run_id)
            if record is not None:  # the run lives on another instance
                await self.services.router.forward(record["owner"], conn, message)
                return
        if isinstance(message, ToolResult):
            await self._tool_result(conn, message)
        elif isinstance(message, Approval):
            await self._approval(conn, message)
        elif isinstance(message, RunCancel):
            await self._cancel(conn, message)

    async def _lookup(self, conn: Peer, run_id: str, reply_to: str | None) -> Run | None:
        run = self.active
        if run is not None and run.run_id == run_id and not run.finishing:
            return run
        known = run_id in self.finished or (run is not None and run.run_id == run_id) or (
            await self.services.backend.get_run_record(self.session.document_id, run_id))
        if known:
            conn.error(ErrorCode.RUN_NOT_ACTIVE, f"run {run_id!r} has finished",
                       reply_to=reply_to, run_id=run_id)
        else:
            conn.error(ErrorCode.RUN_NOT_FOUND, f"no run {run_id!r} on this document",
                       reply_to=reply_to, run_id=run_id)
        return None

    async def _start(self, conn: Peer, message: RunStart) -> None:
        backend, settings = self.services.backend, self.settings
        document_id = self.session.document_id
        if message.run_id is not None:
            existing = self._find(message.run_id)
            record = None if existing else await backend.get_run_record(
                document_id, message.run_id)
            status = existing.status if existing else (record or {}).get("status")
            if status is not None:
                conn.ack(message.id, run_id=message.run_id, status=status, duplicate=True)
                return
        problem = check_tool_schemas(message.tools)
        if problem is not None:
            conn.error(ErrorCode.INVALID_MESSAGE, problem, reply_to=message.id,
                       details=[{"loc": ["tools"], "msg": problem}])
            return
        active = self.active
        if active is not None and not active.finishing and (
            active.client_id != conn.client_id or active.user_id != conn.user_id
        ):
            conn.error(ErrorCode.DOCUMENT_BUSY,
                       f"run {active.run_id!r} of another client is active on this document",
                       reply_to=message.id, run_id=active.run_id)
            return
        retry_after = await backend.take_run_slot(conn.user_id, settings.rate_runs_per_min)
        if retry_after:
            conn.error(ErrorCode.RATE_LIMITED, "too many runs started; wait before the next",
                       reply_to=message.id, retry_after_ms=retry_after)
            return
        if active is not None and not active.finishing:
            await self.finish(active, Finish("cancelled", "superseded"))
        options = message.options
        max_steps = settings.max_steps
        if options is not None and options.max_steps is not None:
            max_steps = min(max_steps, options.max_steps)
        run = Run(
            run_id=message.run_id or f"run_{uuid.uuid4().hex[:16]}",
            document_id=document_id, mode=message.mode, user_id=conn.user_id,
            client_id=conn.client_id, prompt=message.prompt, context=message.context,
            tools=ToolBox(message.tools if message.mode == "agent" else [],
                          BUILTIN_SERVER_TOOLS if message.mode == "agent" else ()),
            max_steps=max_steps,
            model=(options.model if options and options.model else settings.model),
        )
        holder = await backend.claim_run(document_id, self._active_record(run),
                                         settings.run_lease_s)
        if holder is not None and holder.get("client_id") == conn.client_id and \
                holder.get("user_id") == conn.user_id and \
                holder.get("owner") != self.services.instance_id:
            self.services.router.post(str(holder["owner"]), {
                "kind": "supersede", "document_id": document_id, "run_id": holder["run_id"]})
            for _ in range(60):  # the owner ends it in milliseconds; a dead one's lease lapses
                await asyncio.sleep(0.05)
                holder = await backend.claim_run(
                    document_id, self._active_record(run), settings.run_lease_s)
                if holder is None:
                    break
        if holder is not None:
            conn.error(ErrorCode.DOCUMENT_BUSY,
                       f"run {holder.get('run_id')!r} of another client is active on this "
                       "document", reply_to=message.id, run_id=holder.get("run_id"))
            return
        self.active = run
        await backend.put_run_record(document_id, run.run_id, self._record(run))
        history = await backend.read_history(document_id)
        await backend.append_history(document_id, [prompt_entry(run)])
        await self.session.publish(RunStarted(
            run_id=run.run_id, mode=run.mode, user_id=run.user_id, client_id=run.client_id,
            prompt=run.prompt))
        conn.ack(message.id, run_id=run.run_id, status="running")
        loop = AgentLoop(
            run, self.services.llm, self, system_prompt=settings.system_prompt,
            history=history, tool_format=settings.tool_format,
        )
        self._tasks[run.run_id] = asyncio.create_task(self._drive(run, loop))
        self._renewals[run.run_id] = asyncio.create_task(self._renew(run))
        self._timers[run.run_id] = asyncio.get_running_loop().call_later(
            settings.run_timeout_s, self._in_background,
            lambda: self.finish(run, Finish("timed_out", "run_timeout")))

    def _find(self, run_id: str) -> Run | None:
        if self.active is not None and self.active.run_id == run_id:
            return self.active
        return self.finished.get(run_id)

    async def _drive(self, run: Run, loop: AgentLoop) -> None:
        try:
            try:
                outcome = await loop.execute()
            except ModelError as exc:
                outcome = Finish("failed", "upstream_error",
                                 RunError(code="upstream_error", message=str(exc)))
            except asyncio.CancelledError:
                if run.finishing:
                    return
                raise
            except Exception:
                ref = uuid.uuid4().hex[:12]
                logger.exception("run failed (ref %s)", ref, extra={
                    "run_id": run.run_id, "document_id": run.document_id})
                outcome = Finish("failed", "internal_error",
                                 RunError(code="internal", message=f"internal error (ref {ref})"))
            await self.finish(run, outcome)
        finally:
            self._tasks.pop(run.run_id, None)
            self.services.hub.release(self.session)

    async def _tool_result(self, conn: Peer, message: ToolResult) -> None:
        run = await self._lookup(conn, message.run_id, message.id)
        if run is None:
            return
        verdict = judge_tool_result(run, message, conn.user_id, self.services.auth, now_ms())
        if isinstance(verdict, Accept) and verdict.pending.answered:
            verdict = Duplicate()
        if isinstance(verdict, Refuse):
            conn.error(verdict.code, verdict.message, reply_to=message.id, run_id=run.run_id)
            return
        if isinstance(verdict, Accept):
            pending = verdict.pending
            pending.answered = True
            claimed = await self.services.backend.claim_once(
                f"call:{run.run_id}:{pending.call_id}", CALL_CLAIM_TTL_S)
            if claimed and not run.finishing:
                error = message.error.to_wire() if message.error is not None else None
                outcome = ToolOutcome("error", error=error) if error is not None else \
                    ToolOutcome("ok", output=message.output)
                run.completed_calls.add(pending.call_id)
                await self.session.publish(ToolDone(
                    run_id=run.run_id, call_id=pending.call_id, status=outcome.status,
                    output=outcome.output, error=outcome.error))
                if not pending.future.done():
                    pending.future.set_result(outcome)
                conn.ack(message.id, run_id=run.run_id, call_id=message.call_id, status="accepted")
                return
            if run.finishing:
                conn.error(ErrorCode.RUN_NOT_ACTIVE, "the run has finished",
                           reply_to=message.id, run_id=run.run_id)
                return
        conn.ack(message.id, run_id=run.run_id, call_id=message.call_id, duplicate=True)

    async def _users_run(self, conn: Peer, run_id: str, reply_to: str | None, action: str
                         ) -> Run | None:
        """The active run `run_id`, if `conn`'s user is the run's user (else an error)."""
        run = await self._lookup(conn, run_id, reply_to)
        if run is not None and conn.user_id != run.user_id:
            conn.error(ErrorCode.FORBIDDEN, f"only the run's user may {action}",
                       reply_to=reply_to, run_id=run.run_id)
            return None
        return run

    async def _approval(self, conn: Peer, message: Approval) -> None:
        run = await self._users_run(conn, message.run_id, message.id, "answer its approvals")
        if run is None:
            return
        pending = run.pending.get(message.call_id)
        if pending is None or pending.kind != "approval" or pending.answered:
            conn.error(ErrorCode.CALL_NOT_PENDING,
                       f"no approval {message.call_id!r} is pending", reply_to=message.id,
                       run_id=run.run_id)
            return
        arguments = pending.arguments
        if message.decision == "approve" and message.arguments is not None:
            checked = run.tools.check(pending.name, message.arguments)
            if isinstance(checked, str):
                conn.error(ErrorCode.INVALID_MESSAGE, checked, reply_to=message.id,
                           run_id=run.run_id, details=[{"loc": ["arguments"], "msg": checked}])
                return
            arguments = checked.arguments
        pending.answered = True
        if message.decision == "approve" and message.scope == "run":
            run.approved_names.add(pending.name)
        await self.session.publish(ApprovalResolved(
            run_id=run.run_id, call_id=pending.call_id, decision=message.decision,
            user_id=conn.user_id))
        if not pending.future.done():
            pending.future.set_result(ApprovalAnswer(message.decision, arguments, message.reason))
        conn.ack(message.id, run_id=run.run_id, call_id=message.call_id, status=message.decision)

    async def _cancel(self, conn: Peer, message: RunCancel) -> None:
        run = await self._users_run(conn, message.run_id, message.id, "cancel it")
        if run is None:
            return
        await self.finish(run, Finish("cancelled", "user_cancelled"))
        conn.ack(message.id, run_id=run.run_id, status="cancelled")

    # -- ending -------------------------------------------------------------------
    async def finish(self, run: Run, outcome: Finish) -> None:
        """End `run` exactly once: cancel its task, settle pending calls, log the end."""
        if run.finishing:
            return
        run.finishing = True
        run.status = outcome.status
        for timers in (self._timers, self._grace):
            timer = timers.pop(run.run_id, None)
            if timer is not None:
                timer.cancel()
        task = self._tasks.get(run.run_id)
        if task is not None and task is not asyncio.current_task():
            task.cancel()
        renewal = self._renewals.pop(run.run_id, None)
        if renewal is not None and renewal is not asyncio.current_task():
            renewal.cancel()
        if self.active is run:
            self.active = None
        self.finished[run.run_id] = run
        while len(self.finished) > FINISHED_RUNS_KEPT:
            self.finished.popitem(last=False)
        pending, run.pending = list(run.pending.values()), {}
        partial = "".join(run.message_parts)
        for item in pending:
            if not item.future.done():
                item.future.cancel()
            if item.kind == "tool" and item.answered:
                continue  # its tool.done is already logged
            await self.session.publish(ToolDone(
                run_id=run.run_id, call_id=item.call_id, status="cancelled",
                error={"message": f"run {outcome.status}: {outcome.reason or ''}".strip(": ")}))
        if partial and outcome.status != "completed":
            await self.remember(run, [assistant_entry(run, partial, interrupted=True)])
        await self.session.publish(RunFinished(
            run_id=run.run_id, status=outcome.status, reason=outcome.reason, error=outcome.error,
            steps=run.step, usage=run.usage or None))
        self.services.metrics.runs.labels(outcome.status).inc()
        await self.services.backend.put_run_record(run.document_id, run.run_id, self._record(run))
        with contextlib.suppress(BackendUnavailable):
            await self.services.backend.release_run(run.document_id, run.run_id)

    def _record(self, run: Run) -> dict[str, Any]:
        return {"status": run.status, "user_id": run.user_id, "client_id": run.client_id}

    def _active_record(self, run: Run) -> dict[str, Any]:
        """What other instances know of a live run: its snapshot and its owner."""
        return {**run.snapshot(run.user_id).to_wire(), "owner": self.services.instance_id}

    async def _renew(self, run: Run) -> None:
        """Hold the run's lease while it lives; losing it means a survivor ended it."""
        interval = self.settings.run_lease_s / 3
        while not run.finishing:
            await asyncio.sleep(interval)
            if not await self._refresh_lease(run):
                return

    async def _refresh_lease(self, run: Run) -> bool:
        try:
            held = await self.services.backend.renew_run(
                run.document_id, self._active_record(run), self.settings.run_lease_s)
        except BackendUnavailable:
            return True  # keep trying; the lease still runs
        if not held and not run.finishing:
            logger.warning("run lost its lease; another instance ended it",
                           extra={"run_id": run.run_id, "document_id": run.document_id})
            run.finishing = True  # its run.finished was logged by the survivor
            task = self._tasks.get(run.run_id)
            if task is not None:
                task.cancel()
            if self.active is run:
                self.active = None
        return held

    # -- timers -------------------------------------------------------------------
    def update_grace(self, run: Run) -> None:
        """Arm the client grace timer while the run waits on an absent executor."""
        present = any(
            c.client_id == run.client_id and c.user_id == run.user_id
            for c in self.session.connections.values()
        )
        armed = self._grace.get(run.run_id)
        if run.finishing or present or not run.waiting_on_executor():
            if armed is not None:
                armed.cancel()
                del self._grace[run.run_id]
        elif armed is None:
            self._grace[run.run_id] = asyncio.get_running_loop().call_later(
                self.settings.client_grace_s, self._in_background,
                lambda: self._grace_expired(run))
        if not run.finishing and not run.waiting_on_executor():
            self._in_background(lambda: self._refresh_lease(run))  # fresh snapshot for others

    async def share_state(self, run: Run) -> None:
        """Write the run's snapshot to the shared record now (before announcing a call)."""
        if not run.finishing:
            await self._refresh_lease(run)

    async def _grace_expired(self, run: Run) -> None:
        self._grace.pop(run.run_id, None)
        if run.finishing or not run.waiting_on_executor():
            return
        try:
            elsewhere = await self.services.backend.is_present(
                run.document_id, run.user_id, run.client_id)
        except BackendUnavailable:
            elsewhere = True  # do not end a run because the backend blinked
        if elsewhere:
            self._grace[run.run_id] = asyncio.get_running_loop().call_later(
                self.settings.client_grace_s, self._in_background,
                lambda: self._grace_expired(run))
            return
        await self.finish(run, Finish("aborted", "client_gone"))

    def _in_background(self, make: Any) -> None:
        task = asyncio.get_running_loop().create_task(make())
        self._background.add(task)
        task.add_done_callback(self._background_done)

    def _background_done(self, task: "asyncio.Task[Any]") -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("background run task failed", exc_info=task.exception(),
                         extra={"document_id": self.session.document_id})
