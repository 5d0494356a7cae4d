"""Runs one run: feeds inputs to the machine, one at a time, and executes its effects.

The driver owns the I/O of a run and none of its decisions. One task reads the
run's inbox and applies each input in order; the model call, a server tool and
the lease renewal are children in one `asyncio.TaskGroup` that only ever put
inputs back into the inbox; timers are loop callbacks that do the same. So every
decision is taken by one task, in order, and an ending can cancel all of it.

Atomicity: a decision's state becomes the run's state only once its first
`Publish` is logged when the input can be refused (a client's `tool.result`
or `approval`, the start); a failed publish leaves the old state and answers
the sender `unavailable` or `invalid_message`, so the client may retry. Other
decisions are committed at once and their events published with retries,
like an outbox. Whatever fails, the run ends and the document is released: a
bug becomes `failed`/`internal_error`, or the document is freed anyway.
"""

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from protocol.codes import ErrorCode
from protocol.server import Error
from server import tracing
from server.agent import history
from server.agent.commit import NOT_NOW, CommitMixin, NotNow, Then
from server.agent.environment import RunEnvironment
from server.agent.lease import FencedLog, RunLease
from server.agent.run_state import RunState
from server.agent.steps import (
    ArmTimer,
    Begin,
    CallModel,
    Checkpoint,
    Crashed,
    Decision,
    DisarmTimer,
    Effect,
    Input,
    LeaseLost,
    ModelFinished,
    ModelUnparseable,
    Publish,
    Release,
    Remember,
    RememberPartial,
    Reply,
    Resume,
    RunServerTool,
    StopWork,
    TimerFired,
)
from server.agent.timers import RunTimers
from server.agent.tools import ToolBox
from server.agent.work import model_turn, new_ref, now_ms, server_tool
from server.backends.base import BackendUnavailable
from server.connection import Peer
from server.continuation import start_eagerly
from server.inbox import Envelope, RunInbox
from server.ports import EventLog

logger = logging.getLogger("cowrite.agent")
_Work = Coroutine[Any, Any, None]  # an effect's I/O, awaited by the driver


class RunDriver(CommitMixin):
    def __init__(self, state: RunState, env: RunEnvironment, log: EventLog, toolbox: ToolBox,
                 on_finished: Callable[["RunDriver"], None]) -> None:
        self.state = state
        self.env = env
        self.log = log
        # An in-process log's append as a plain call (`DocumentSession.publish_now`)
        self._publish_now = None if log.remote else getattr(log, "publish_now", None)
        self.toolbox = toolbox
        self.lease = RunLease(env)
        self._on_finished = on_finished
        # of Envelope; one reader: the driver's task (or a sender's turn, see `submit`)
        self._inbox = RunInbox(lambda sent: self._apply(sent.event, sent.peer, sent),
                               lambda: not self.state.finished)
        self._shared = env.registry.remote  # (a class constant) `lease.shared`, as a field
        self._current: Envelope | None = None  # the last input applied (answered?)
        self._group: asyncio.TaskGroup | None = None
        self._model_task: asyncio.Task[None] | None = None
        self._model_due: RunState | None = None  # a model turn to start eagerly
        self._tool_task: asyncio.Task[None] | None = None
        self._renewal: asyncio.Task[None] | None = None
        self._timers = RunTimers(self._timer_fired)
        self._parts: list[str] = []  # text the current message streamed so far
        self._released = False
        self.answered: Peer | None = None  # the sender answered during the commit
        self.waits_out_outage = False  # a decision waits out an outage (commit.py)
        self._main: asyncio.Task[None] | None = None
        self._started: asyncio.Future[bool] | None = None
        self.done = asyncio.Event()
        self.last_live_state: RunState | None = None  # the state when the lease went
        self.kicks_queue = True  # its end starts the document's next queued run

    # -- lifetime -------------------------------------------------------------------
    async def start(self, peer: Peer | None, reply_to: str | None,
                    resume: Resume | None = None) -> bool:
        """Announce the run (or its takeover); False, with nothing logged, if that failed."""
        self._started = self._inbox.future()
        self._main = asyncio.create_task(self._serve(resume or Begin(now_ms(), reply_to), peer))
        return await asyncio.shield(self._started)

    def feed(self, event: Input, peer: Peer | None = None) -> None:
        if not self.done.is_set():
            self._inbox.put_nowait(Envelope(event, peer))

    async def submit(self, event: Input, peer: Peer | None = None) -> bool:
        """Feed `event` and wait until it was dealt with: applied, or refused with an
        answer to `peer`. False when the run ended first or moved to another instance
        (then whoever has the run now must get it). Applied in the caller's task when the
        driver waits idle (memory mode: no `asyncio.timeout` on the way; `RunInbox`)."""
        if self.done.is_set():
            return False
        envelope, group = Envelope(event, peer), self._group
        if not self._shared and group is not None and not self.state.finished and \
                self._inbox.take_turn(envelope, group.create_task):
            if envelope.answer is not None:
                return envelope.answer
        else:
            self._inbox.put_nowait(envelope)
        envelope.done = self._inbox.future()
        return await envelope.done

    async def _serve(self, begin: Input, peer: Peer | None) -> None:
        try:
            async with asyncio.TaskGroup() as group:
                self._group = group
                accepted = await self._apply(begin, peer)
                assert self._started is not None
                self._started.set_result(accepted)
                if not accepted:
                    self._released = True  # nothing was logged: the coordinator frees the claim
                    return
                if self.env.registry.remote and not self.state.finished:  # (a takeover
                    self._renewal = self._spawn(self._renew())  # can end at once: `Crashed`)
                while not self.state.finished:
                    if (envelope := await self._inbox.take()) is not None:
                        await self._apply(envelope.event, envelope.peer, envelope)
                self._stop_children(renewal=True)
        except Exception:
            logger.exception("run driver failed", extra=self.log_extra)
        finally:
            await self._last_resort()

    async def _last_resort(self) -> None:
        """However the driver ended, the run has its `run.finished`, the document is
        free and waiters are answered (unless another instance took the run over)."""
        self._timers.disarm("*")
        if self._started is not None and not self._started.done():
            self._started.set_result(False)
            self._released = True
        self._released = self._released or not await self.lease.still_held(self.state)
        if not self._released and not self.state.finished:
            ref = new_ref()
            logger.error("run driver stopped early (ref %s); ending the run", ref,
                         extra=self.log_extra)
            decision = self.env.machine.decide(self.state, crashed := Crashed(ref))
            self.state = decision.state
            if tracing.active is not None:
                tracing.active.observe(crashed, decision)  # the run's spans end with it
            with contextlib.suppress(Exception):
                for effect in decision.effects:
                    if isinstance(effect, Publish):
                        await self.log.publish_many(effect.events)
                    elif isinstance(effect, Release):
                        await self._release(effect)
        if not self._released:
            logger.error("run ended without its release; freeing it", extra=self.log_extra)
            with contextlib.suppress(Exception):
                await self.lease.free(self.state)
        self._inbox.refuse_all(self._current)  # with the one whose application failed
        self.done.set()
        self._on_finished(self)

    # -- applying inputs ------------------------------------------------------------
    async def _apply(self, event: Input, peer: Peer | None, sent: Envelope | None = None) -> bool:
        """Decide and execute; True when the decision was committed. The envelope the
        input was `sent` in is answered then, and a run it ended stops its children."""
        if sent is not None:
            self._current = sent
        if isinstance(event, (ModelFinished, ModelUnparseable)):
            self._parts = []
        if isinstance(event, LeaseLost):  # another instance holds the run now: not ours to
            self.last_live_state, self._released = self.state, True  # free or to end
        decision: Decision | None
        try:
            decision = self.env.machine.decide(self.state, event)
        except Exception:
            ref = new_ref()
            logger.exception("run machine failed on %s (ref %s)", type(event).__name__, ref,
                             extra=self.log_extra)
            if peer is not None:
                peer.reply(Error(code=ErrorCode.INTERNAL, message=f"internal error (ref {ref})",
                                 reply_to=getattr(event, "reply_to", None), run_id=self.run_id))
                decision = None
            else:
                decision = self.env.machine.decide(self.state, Crashed(ref))
        committed = decision is not None and await self._execute(decision, peer)
        # Traced only while it is the run's current decision: one whose publish failed
        # ended the run meanwhile (`Crashed`, traced then), and tracing it after that
        # opened spans (a `Resume`'s run span) for a run that had ended, never closed.
        if committed and decision is not None and tracing.active is not None and \
                self.state is decision.state:
            tracing.active.observe(event, decision)
        if self._model_due is not None:
            self._start_model_eagerly(self._model_due)
        if sent is not None:  # refused with an answer to its sender counts as dealt with
            sent.settle(committed or self.last_live_state is None)
            if self.state.finished:  # now, as the driver's loop did, not when a turn ends
                self._stop_children(renewal=True)
        return committed

    def _start_model_eagerly(self, state: RunState) -> None:
        """A scripted turn that asks for a tool never waits: its `ModelFinished` is then
        decided next with no task and no trip through the loop (`eager_turns` models)."""
        self._model_due = None
        assert self._group is not None
        self._model_task = start_eagerly(self._guarded(self._model_call(state)),
                                         self._group.create_task)

    async def _execute(self, decision: Decision, peer: Peer | None) -> bool:
        """Effects before the decision's `Publish`, the publish (the commit point),
        then the rest. A publish that fails means the decision did not happen."""
        effects = decision.effects
        slot = -1
        for index, effect in enumerate(effects):
            if type(effect) is Publish:
                slot = index
                break
        shared = self._shared
        # Stalled: confirm the lease first. An ending is written with its final checkpoint
        # (its write id makes a retry through an outage log it once; a survivor finds the
        # run ended, see `TakeoverMixin.let_go_if_ended`).
        fence = shared and slot >= 0 and (self.lease.stale or decision.state.finished)
        if slot == 1 and type(effects[0]) is Checkpoint:  # the usual lone one: no coroutine
            fence = fence or shared  # (written below if shared; with one process, nobody reads it)
        elif slot > 0:
            before = effects[:slot]
            if shared and any(type(effect) is Checkpoint for effect in before):
                fence = True  # the checkpoint is written below, where the lease is checked
                before = tuple(effect for effect in before if type(effect) is not Checkpoint)
            await self._run_effects(before, peer, decision.state)
        if slot >= 0:
            publish = effects[slot]
            assert isinstance(publish, Publish)
            now = NOT_NOW if fence else self._logged_now(publish, decision, peer)
            if isinstance(now, NotNow):
                done = await self._log_decision(publish, decision, peer, fence)
            else:
                done = await self._then(now) if isinstance(now, Then) else now
            if done is not None:
                return done
            if peer is not None and self.answered is peer:  # told `unavailable` while
                peer = self.answered = None  # it waited out an outage (commit.py)
        self.state, self.lease.announcing = decision.state, None
        await self._run_effects(effects[slot + 1:], peer, decision.state)
        return True

    async def _run_effects(self, effects: tuple[Effect, ...], peer: Peer | None,
                           state: RunState) -> None:
        """Each effect in order, found by its exact type (effects are final classes).
        Most are plain calls; only those doing I/O return a coroutine to await, so a
        round trip's eight or so effects cost no coroutine each. One that fails ends
        the run (unless it is over) and the rest still run."""
        for effect in effects:
            try:
                handler = _EFFECTS.get(type(effect))
                pending = None if handler is None else handler(self, effect, peer, state)
                if pending is not None:
                    await pending
            except Exception:
                ref = new_ref()
                logger.exception("run effect %s failed (ref %s)", type(effect).__name__, ref,
                                 extra=self.log_extra)
                if not state.finished:
                    self.feed(Crashed(ref))

    def _remember_partial(self, effect: RememberPartial, peer: Peer | None, state: RunState
                          ) -> _Work | None:
        partial = "".join(self._parts)
        self._parts = []
        return self._remember([history.assistant_entry(
            state.run_id, partial, True, state.thread_id, effect.interrupted_by)]) \
            if partial else None

    def _call_model(self, effect: CallModel, peer: Peer | None, state: RunState) -> None:
        if getattr(self.env.llm, "eager_turns", False):
            self._model_due = state  # started once the decision's effects are done
        else:
            self._model_task = self._spawn(self._model_call(state))

    def _spawn_tool(self, effect: RunServerTool) -> None:
        self._tool_task = self._spawn(self._server_tool(effect))

    def _checkpoint_effect(self, effect: Checkpoint, peer: Peer | None, state: RunState
                           ) -> _Work | None:  # with one process nobody reads checkpoints
        return self._checkpoint(state) if self._shared else None

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> "asyncio.Task[None]":
        assert self._group is not None
        return self._group.create_task(self._guarded(coroutine))

    async def _guarded(self, coroutine: Coroutine[Any, Any, None]) -> None:
        """A child never takes the task group down: a bug in it ends the run instead."""
        try:
            await coroutine
        except Exception:
            ref = new_ref()
            logger.exception("run task failed (ref %s)", ref, extra=self.log_extra)
            self.feed(Crashed(ref))

    def _stop_children(self, renewal: bool) -> None:
        self._model_due = None
        for task in (self._model_task, self._tool_task, self._renewal if renewal else None):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        if renewal:  # the run is over: a second cancel would cut a child's cleanup short
            self._model_task = self._tool_task = self._renewal = None

    def _timer_fired(self, key: str) -> None:
        if key == "grace" and self._shared:
            self._spawn(self._confirm_gone())  # the executor may be on another instance
            return
        self.feed(TimerFired(key))

    async def _confirm_gone(self) -> None:
        state = self.state
        try:
            elsewhere = await self.env.registry.is_present(state.document_id, state.user_id,
                                                           state.client_id)
        except BackendUnavailable:
            elsewhere = True  # do not end a run because the backend blinked
        if elsewhere and not self.state.finished:
            self._timers.start("grace", self.env.settings.client_grace_s)
        else:
            self.feed(TimerFired("grace"))

    async def _remember(self, entries: list[dict[str, Any]]) -> None:
        try:
            await self.env.registry.append_history(self.state.document_id, entries)
        except BackendUnavailable:
            logger.warning("history entries lost: backend unavailable", extra=self.log_extra)

    async def _checkpoint(self, state: RunState) -> None:
        """Share the state (a checkpoint after a decision that announced nothing)."""
        if not await self.lease.checkpoint(state):
            self.feed(LeaseLost())

    async def _release(self, effect: Release) -> None:
        await self.lease.release(self.state)
        self._released = True

    async def _renew(self) -> None:
        if await self.lease.keep(lambda: self.lease.announcing or self.state):
            self.feed(LeaseLost())

    # -- children: the model and server tools --------------------------------------
    async def _model_call(self, state: RunState) -> None:
        self._parts = []
        log = FencedLog(self.log, self.lease, lambda: self.state) if self._shared else self.log
        self.feed(await model_turn(state, self.env.llm, log, self.toolbox, self._parts))

    async def _server_tool(self, effect: RunServerTool) -> None:
        assert self.env.tools is not None  # a server call implies a catalog
        self.feed(await server_tool(self.state, self.env.tools, effect))


_EFFECTS: dict[type[Any], Callable[[RunDriver, Any, Peer | None, RunState], _Work | None]] = {
    Reply: lambda driver, effect, peer, state: peer.reply(effect.message) if peer else None,
    Remember: lambda driver, effect, peer, state: driver._remember(list(effect.entries)),
    RememberPartial: RunDriver._remember_partial, CallModel: RunDriver._call_model,
    RunServerTool: lambda driver, effect, peer, state: driver._spawn_tool(effect),
    StopWork: lambda driver, effect, peer, state: driver._stop_children(renewal=False),
    ArmTimer: lambda driver, effect, peer, state: driver._timers.arm(effect.key, effect.delay_s),
    DisarmTimer: lambda driver, effect, peer, state: driver._timers.disarm(effect.key),
    Checkpoint: RunDriver._checkpoint_effect,
    Release: lambda driver, effect, peer, state: driver._release(effect),
}
