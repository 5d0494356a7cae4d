"""Runs owned by another instance (Redis backend): the cluster link.

The instance running a run's agent loop owns it and renews a lease. A
message about that run arriving elsewhere is forwarded to the owner's inbox
(a Redis stream: durable, ordered), handled there as if its sender were
local (`RemotePeer`), and the owner's `ack`/`error` travel back through the
sender's instance inbox. Every instance also runs a janitor: a run whose
lease lapsed (its owner died, or handed it over while draining) is taken by
exactly one survivor, which continues it from its checkpoint (section 13) or,
when it has none or is older than the run timeout, ends it through the same
run machine as any other ending (`End` aborted / `server_lost`), so the
pending call gets its `tool.done` and the run its one `run.finished`. A run
that had ended (its owner died between logging `run.finished` and freeing the
run) is only freed, with nothing announced.

No message about a run is lost to a takeover: it is sent to the instance that
holds the run's lease at that instant (one atomic step), an instance that let
the run go waits for the next holder before passing it on, and the next owner
acts on what the previous one left unread in its inbox (each message is
claimed once, by whoever acts on it). A draining instance takes over nothing.
"""

import asyncio
import collections
import contextlib
import logging
from typing import Any

from protocol.base import WireModel
from protocol.client import EditorChange
from protocol.codes import ErrorCode
from protocol.parsing import ParseFailure, validate_message
from server.agent.machine import RunMachine
from server.agent.remote_peer import RemotePeer
from server.agent.run_state import orphan_state
from server.agent.steps import End, Publish, Release
from server.agent.takeover import let_go_if_ended
from server.agent.work import now_ms
from server.backends.base import Backend, BackendUnavailable, cancel_requested
from server.connection import Peer
from server.observability import Metrics
from server.session_hub import SessionHub

logger = logging.getLogger("cowrite.remote")
TAKEOVER_SLACK_S = 2.0  # a lapsed lease is taken over within a janitor tick of lapsing
# How long a message waits for a run's next owner. A takeover takes a lease and a
# janitor tick, but on a starved machine (every process on one core, a new instance
# importing) it took longer than 3 s in the rolling-restart test: giving up then
# made the client answer twice or, if it does not retry, time the call out.
DELIVERY_WAIT_LEASES, DELIVERY_WAIT_SLACK_S = 3, 10.0
TAKEOVER_POLL_S = 0.05
STOP_WAIT_S = 2.0
_Queued = tuple[str, dict[str, Any], Peer | None]  # run id, message, who waits for an answer


def _answers_a_call(message: dict[str, Any]) -> bool:
    """A forwarded `tool.result` or `approval`: taken from the inbox only once applied by
    the instance driving its run, so an owner killed while applying it leaves it for the
    next owner's replay (taken first, it was lost, and the call timed out). Applied twice
    it is harmless: the run answers a repeat as a duplicate. An instance that no longer
    drives the run takes it first (a stalled owner woke to an answer its successor had
    replayed and applied, and sent the client a second reply). Other messages are taken
    first (an edit applied twice would move the run's scope twice)."""
    inner = message.get("message")
    return message.get("kind") == "message" and isinstance(inner, dict) and \
        inner.get("type") in ("tool.result", "approval")


class RunRouter:
    def __init__(self, backend: Backend, hub: SessionHub, machine: RunMachine, metrics: Metrics,
                 instance_id: str, lease_s: float, run_timeout_s: float = 600.0,
                 durable: bool = True) -> None:
        self.backend = backend
        self.hub = hub
        self.machine = machine
        self.metrics = metrics
        self.me = instance_id
        self.lease_s = lease_s
        self.run_timeout_s = run_timeout_s
        self.durable = durable  # False (COWRITE_DURABLE_RUNS=0): lost runs end server_lost
        self.draining = False
        self._tasks: list[asyncio.Task[None]] = []
        self._posts: set[asyncio.Task[None]] = set()
        self._deliveries: set[asyncio.Task[None]] = set()
        # per document, the messages on their way to its run's owner, in order (`_queue`)
        self._lanes: dict[str, collections.deque[_Queued]] = {}

    async def start(self) -> None:
        with contextlib.suppress(BackendUnavailable):  # alive before the first janitor tick
            await self.backend.heartbeat(self.me, self.lease_s * 2)
        self._tasks = [asyncio.create_task(self._inbox_loop()),
                       asyncio.create_task(self._janitor_loop())]

    async def begin_drain(self) -> bool:
        """Stop taking runs over and leave the live set (so no other draining instance
        hands its runs to this one); whether another instance lives to take this
        one's runs (a handoff)."""
        self.draining = True
        try:
            await self.backend.leave(self.me)
            return any(other != self.me for other in await self.backend.live_instances())
        except BackendUnavailable:
            return False

    async def stop(self) -> None:
        if self._deliveries:  # messages waiting for the next owner of a handed-over run
            await asyncio.wait(set(self._deliveries), timeout=self.lease_s + TAKEOVER_SLACK_S)
        with contextlib.suppress(BackendUnavailable):
            await self.backend.leave(self.me)
        pending = self._tasks + list(self._posts) + list(self._deliveries)
        for task in pending:
            task.cancel()
        # Bounded, whatever a library does with the cancel (see `cancel_requested`):
        # a shutdown must not hang on these tasks.
        _, stuck = await asyncio.wait(pending, timeout=STOP_WAIT_S) if pending else ((), ())
        if stuck:
            logger.warning("%d cluster task(s) did not stop; leaving them", len(stuck))

    def envelope(self, peer: Peer, message: WireModel) -> dict[str, Any]:
        """A client's message as it travels to a run's owner (whose answer goes back to
        the instance the client is connected to)."""
        return {"kind": "message", "document_id": peer.document_id,
                "origin": peer.origin if isinstance(peer, RemotePeer) else self.me,
                "connection": peer.session_id, "user_id": peer.user_id,
                "client_id": peer.client_id, "message": message.to_wire()}

    async def to_run_owner(self, document_id: str, run_id: str, message: dict[str, Any],
                           peer: Peer | None = None) -> bool:
        """Bring `message` to the instance that holds the lease of the active run
        `run_id` (this one does not run it): at once, or, while the run changes hands
        (a handoff, or this instance let it go), once the next holder has it, in the
        background. False, with nothing sent, when the run is not active. Sent after
        the messages about the document this instance is still forwarding (an edit from
        the same connection just before: the run must see it before this answer)."""
        if document_id in self._lanes:
            record = await self.backend.active_run(document_id)
            if record is None or record.get("run_id") != run_id:
                return False
            self._queue(document_id, run_id, message, peer)
            return True
        sent = await self.backend.send_to_run_owner(document_id, run_id, message,
                                                    not_to=self.me)
        if sent is None:
            return False
        if not sent:  # what is sent next about the document waits for this one
            self._queue(document_id, run_id, message, peer)
        return True

    async def _after_takeover(self, document_id: str, run_id: str, message: dict[str, Any],
                              peer: Peer | None) -> None:
        """Send `message` once another instance holds the run, or this one runs it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.lease_s * DELIVERY_WAIT_LEASES + DELIVERY_WAIT_SLACK_S
        reply_to = (message.get("message") or {}).get("id")
        while loop.time() < deadline:
            await asyncio.sleep(TAKEOVER_POLL_S)
            session = self.hub.sessions.get(document_id)
            here = session is not None and session.runs.busy  # a takeover by this instance
            try:
                sent = await self.backend.send_to_run_owner(document_id, run_id, message,
                                                            not_to="" if here else self.me)
            except BackendUnavailable:
                continue
            if sent is None:
                if peer is not None:
                    peer.error(ErrorCode.RUN_NOT_ACTIVE, f"run {run_id!r} has finished",
                               reply_to=reply_to, run_id=run_id)
                return
            if sent:
                return
        if peer is not None:
            peer.error(ErrorCode.UNAVAILABLE, "the run is moving to another instance; "
                       "retry shortly", reply_to=reply_to, run_id=run_id, retry_after_ms=1000)

    def has_lane(self, document_id: str) -> bool:
        """Whether messages about the document are still on their way from this instance
        (`_queue`): a message for a run that now runs here goes behind them."""
        return document_id in self._lanes

    def post_to_run_owner(self, document_id: str, run_id: str, message: dict[str, Any]
                          ) -> None:
        """`to_run_owner` without waiting (an edit: nobody to answer), after whatever this
        instance forwarded about the document before (`_queue`)."""
        self._queue(document_id, run_id, message, None)

    def _queue(self, document_id: str, run_id: str, message: dict[str, Any],
               peer: Peer | None) -> None:
        """Send `message` after the document's messages still on their way, in order. A
        change list is in the coordinates the previous edit left: sent by one task each,
        edits raced on the Redis pool and reached the owner out of order, which judged
        an edit nowhere near the run's scope as touching it and aborted the run."""
        lane = self._lanes.get(document_id)
        if lane is None:
            lane = self._lanes[document_id] = collections.deque()
            task = asyncio.get_running_loop().create_task(self._send_lane(document_id, lane))
            self._deliveries.add(task)  # `stop` waits for them as for any delivery
            task.add_done_callback(self._deliveries.discard)
        lane.append((run_id, message, peer))

    async def _send_lane(self, document_id: str, lane: collections.deque[_Queued]) -> None:
        """One task per document with messages queued: each is sent once the one before it
        is (through a takeover too: then the next owner gets them, in order)."""
        try:
            while lane:
                try:
                    await self._send_queued(document_id, *lane[0])
                except Exception:
                    logger.exception("forwarding a message to a run's owner failed",
                                     extra={"document_id": document_id})
                lane.popleft()
        finally:  # no wait since the last `while lane`: nothing was queued in between
            if self._lanes.get(document_id) is lane:
                del self._lanes[document_id]

    async def _send_queued(self, document_id: str, run_id: str, message: dict[str, Any],
                           peer: Peer | None) -> None:
        here = self._runs_here(document_id, run_id)  # taken over meanwhile: to itself
        try:  # (its own inbox, behind what it was sent before; polled, it lagged live input)
            sent = await self.backend.send_to_run_owner(document_id, run_id, message,
                                                        not_to="" if here else self.me)
        except BackendUnavailable:
            sent = ""  # tried again for as long as a takeover is waited for
        if sent == "":
            await self._after_takeover(document_id, run_id, message, peer)
        elif sent is None and peer is not None:  # it ended while queued
            peer.error(ErrorCode.RUN_NOT_ACTIVE, f"run {run_id!r} has finished",
                       reply_to=(message.get("message") or {}).get("id"), run_id=run_id)

    def post(self, instance_id: str, message: dict[str, Any]) -> None:
        """Send without waiting (replies are ephemeral; a lost one is retried by the client)."""
        task = asyncio.get_running_loop().create_task(self._post(instance_id, message))
        self._posts.add(task)
        task.add_done_callback(self._posts.discard)

    async def _post(self, instance_id: str, message: dict[str, Any]) -> None:
        with contextlib.suppress(BackendUnavailable):
            await self.backend.send(instance_id, message)

    async def _inbox_loop(self) -> None:
        async for entry_id, message in self.backend.inbox(self.me):
            try:
                if message.get("kind") == "reply":
                    await self._dispatch(message)
                elif _answers_a_call(message) and self._runs_here(
                        str(message.get("document_id", "")), str(message["message"]["run_id"])):
                    # unless a successor replayed it while this instance was stalled (it
                    # read the entry, then stopped)
                    if await self._unread(entry_id):
                        await self._act(self.me, entry_id, message, applied_first=True)
                else:
                    await self._act(self.me, entry_id, message, applied_first=False)
            except Exception:
                logger.exception("inbox message failed: %s", message.get("kind"))

    async def _act(self, inbox: str, entry_id: str, message: dict[str, Any],
                   applied_first: bool) -> None:
        """Act on an inbox entry once: taken after it is applied (an answer to a call,
        see `_answers_a_call`), or taken first and applied only when this instance won it."""
        if applied_first:
            await self._dispatch(message)
            await self._claim(inbox, entry_id)
        elif await self._claim(inbox, entry_id):
            await self._dispatch(message)

    async def _unread(self, entry_id: str) -> bool:
        try:
            return await self.backend.has_message(self.me, entry_id)
        except BackendUnavailable:
            return True  # act rather than lose it (a repeat is answered as a duplicate)

    async def _claim(self, instance_id: str, entry_id: str) -> bool:
        """Whether this instance acts on the entry (it was not taken by another)."""
        try:
            return await self.backend.take_message(instance_id, entry_id)
        except BackendUnavailable:
            return instance_id == self.me  # one's own inbox: act rather than lose it

    async def _replay(self, owner: str, document_id: str, run_id: str) -> None:
        """Act on the messages about `run_id` that its previous owner left unread."""
        if owner == self.me:
            return
        with contextlib.suppress(BackendUnavailable):
            for entry_id, message in await self.backend.unread_messages(owner):
                about = message.get("run_id") or (message.get("message") or {}).get("run_id")
                if message.get("kind") == "reply" or message.get("document_id") != \
                        document_id or about != run_id:
                    continue
                await self._act(owner, entry_id, message, _answers_a_call(message))

    async def _dispatch(self, message: dict[str, Any]) -> None:
        kind, document_id = message.get("kind"), str(message.get("document_id", ""))
        hub = self.hub
        if kind == "reply":
            session = hub.sessions.get(document_id)
            conn = session.connections.get(message["connection"]) if session else None
            if conn is not None:
                conn.outbound.push_frame(message["type"], message["frame"])
            return
        session = hub.get(document_id)
        try:
            if kind == "message":
                parsed = validate_message(message["message"])
                if isinstance(parsed, ParseFailure):
                    return
                peer = RemotePeer(self, message["origin"], message["connection"], document_id,
                                  message["client_id"], message["user_id"])
                await session.runs.handle(peer, parsed, forwarded=True)
            elif kind == "edit":  # an edit made on another instance (a person's or the run's)
                edit = validate_message(message["message"])
                if isinstance(edit, EditorChange):
                    peer = RemotePeer(self, "", "", document_id, "", str(message["user_id"]))
                    await session.runs.on_edit(peer, edit, forwarded=True)
            elif kind in ("supersede", "interrupt"):
                reason = "superseded" if kind == "supersede" else "interrupted"
                await session.runs.abort(message["run_id"], "cancelled", reason)
        finally:
            hub.release(session)

    async def _janitor_loop(self) -> None:
        interval = max(0.05, self.lease_s / 4)
        while not cancel_requested():
            await asyncio.sleep(interval)
            if self.draining:  # its runs go to others; it takes none of theirs
                continue
            try:
                await self.backend.heartbeat(self.me, self.lease_s * 2)
                for document_id, record in await self.backend.expired_runs(self.me,
                                                                           self.lease_s):
                    if not await self._take_over(document_id, record):
                        await self._end_orphan(document_id, record)
                    await self._replay(str(record.get("owner")), document_id,
                                       str(record.get("run_id")))
            except BackendUnavailable:
                continue
            except Exception:
                logger.exception("ending a lost run failed")

    async def _take_over(self, document_id: str, record: dict[str, Any]) -> bool:
        """Go on with a run whose owner died, from its checkpoint (section 13); False
        when it has none or is older than the run timeout (then it ends server_lost).
        A run whose end its owner logged before dying is only freed (nothing announced:
        it used to come back, `run.resumed`, and end twice)."""
        if self._runs_here(document_id, str(record.get("run_id"))):
            return True  # its lease lapsed (Redis was away) and came back to its owner
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

    def _runs_here(self, document_id: str, run_id: str) -> bool:
        """Whether this instance drives `run_id` now. After an outage longer than a lease,
        this instance's own janitor finds its live runs' leases lapsed; taking one "over"
        found the coordinator busy and ended the run (`server_lost`) under its own driver."""
        session = self.hub.sessions.get(document_id)
        return session is not None and session.runs.drives(run_id)

    async def _end_orphan(self, document_id: str, record: dict[str, Any]) -> None:
        state = orphan_state(document_id, record)
        logger.warning("run %s lost its owner %s", state.run_id, record.get("owner"),
                       extra={"document_id": document_id, "run_id": state.run_id})
        decision = self.machine.decide(state, End("aborted", "server_lost"))
        logged = 0  # write ids the same at every tick: a janitor that failed halfway and
        for effect in decision.effects:  # tries again logs nothing twice
            if isinstance(effect, Publish):
                for event in effect.events:
                    logged += 1
                    await self.backend.append_once(document_id, event.to_wire(),
                                                   f"orphan:{state.run_id}:{logged}")
            elif isinstance(effect, Release):
                final = decision.state
                await self.backend.put_run_record(document_id, final.run_id, {
                    "status": final.status, "user_id": final.user_id,
                    "client_id": final.client_id})
                self.metrics.runs.labels(effect.status).inc()
        await self.backend.release_run(document_id, state.run_id, self.me)
        await self._start_queued(document_id)

    async def _start_queued(self, document_id: str) -> None:
        session = self.hub.get(document_id)  # its queued runs may start now
        try:
            await session.runs.start_queued()
        finally:
            self.hub.release(session)
