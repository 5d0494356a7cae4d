"""Runs owned by another instance (Redis backend): the cluster link.

The instance running a run's agent loop owns it and renews a lease. A
message about that run arriving elsewhere is forwarded to the owner's inbox
(a Redis stream: durable, ordered), handled there as if its sender were
local (`RemotePeer`), and the owner's `ack`/`error` travel back through the
sender's instance inbox. Every instance also runs a janitor (`janitor.py`):
it takes over runs whose lease lapsed and starts queues nobody starts.

No message about a run is lost to a takeover, nor reordered: it goes to the
holder of the run's lease at that instant (one atomic step; while nobody holds
it, the sender waits for the next, `lanes.py`); an instance that let the run go
leaves it unread; the next owner acts on what the previous one left unread
(each message claimed once, by whoever acts on it) before what it is sent
directly (`_held`). A draining instance takes over nothing.
"""

import asyncio
import collections
import contextlib
import logging
from typing import Any

from protocol.base import WireModel
from protocol.client import EditorChange
from protocol.parsing import ParseFailure, validate_message
from server.agent.janitor import JanitorMixin, janitor_interval
from server.agent.lanes import STOP_WAIT_S, Lanes
from server.agent.machine import RunMachine
from server.agent.remote_peer import RemotePeer
from server.agent.run_state import TERMINAL
from server.backends.base import Backend, BackendUnavailable
from server.connection import Peer
from server.observability import Metrics
from server.session_hub import SessionHub

logger = logging.getLogger("cowrite.remote")
TAKEOVER_SLACK_S = 2.0  # a lapsed lease is taken over within a janitor tick of lapsing
LET_GO_POLL_S = 0.02
_Entry = tuple[str, dict[str, Any]]  # an inbox entry: its id, the message


def _about(message: dict[str, Any]) -> tuple[str, str]:
    """The document and the run an inbox message is about ("" when none)."""
    run_id = message.get("run_id") or (message.get("message") or {}).get("run_id")
    return str(message.get("document_id", "")), str(run_id or "")


def _answers_a_call(message: dict[str, Any]) -> bool:
    """A forwarded `tool.result` or `approval`: taken from the inbox only once applied by
    the instance driving its run, so an owner killed while applying it leaves it for the
    next owner's replay (taken first, it was lost, and the call timed out). Applied twice
    it is harmless: the run answers a repeat as a duplicate. An instance that no longer
    drives the run leaves it (`_moved_on`) or takes it first (a stalled owner woke to an
    answer its successor had replayed and applied, and sent the client a second reply).
    Other messages are taken first (an edit applied twice would move a scope twice)."""
    inner = message.get("message")
    return message.get("kind") == "message" and isinstance(inner, dict) and \
        inner.get("type") in ("tool.result", "approval")


class RunRouter(JanitorMixin):
    def __init__(self, backend: Backend, hub: SessionHub, machine: RunMachine, metrics: Metrics,
                 instance_id: str, lease_s: float, run_timeout_s: float = 600.0,
                 durable: bool = True, janitor_interval_s: float = 0.5) -> None:
        self.backend = backend
        self.hub = hub
        self.machine = machine
        self.metrics = metrics
        self.me = instance_id
        self.lease_s = lease_s
        self.janitor_interval_s = janitor_interval(lease_s, janitor_interval_s)
        self.run_timeout_s = run_timeout_s
        self.durable = durable  # False (COWRITE_DURABLE_RUNS=0): lost runs end server_lost
        self.draining = False
        # set by the drain (`lifecycle.drain`): another instance lives and this one's runs
        # go to it, those that become active here later too (see `app.py`'s lifespan)
        self.handing_over = False
        self._tasks: list[asyncio.Task[None]] = []
        self._posts: set[asyncio.Task[None]] = set()
        # per document, the messages on their way to its run's owner, in order
        self._lanes = Lanes(backend, instance_id, lease_s, lambda document_id, run_id:
                            self._runs_here(document_id, run_id)
                            or document_id in self._held)
        # per document whose run this instance takes over, from its lease to the replay of
        # its previous owner's leftovers: the inbox entries about it (see `_release`)
        self._held: dict[str, collections.deque[_Entry]] = {}
        self._claimed = asyncio.Event()  # clear while the janitor claims lapsed leases
        self._claimed.set()
        self._idle = asyncio.Event()  # clear while the inbox loop acts on an entry
        self._idle.set()

    async def start(self) -> None:
        with contextlib.suppress(BackendUnavailable):  # alive before the first janitor tick
            await self.backend.heartbeat(self.me, self.lease_s * 2)
        self._tasks = [asyncio.create_task(self._inbox_loop()),
                       asyncio.create_task(self._janitor_loop())]

    async def begin_drain(self) -> bool:
        """Stop taking runs over and leave the live set (so no other draining instance
        hands its runs to this one); whether another instance lives to take this
        one's runs (a handoff). The inbox entry being acted on is done first."""
        self.draining = True  # from now on the inbox loop waits for a run to be let go
        # Whatever it is in the middle of goes to the run first (`hand_over` comes next):
        # an edit the run refused as it stopped was passed on, after newer ones.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(STOP_WAIT_S):
                await self._idle.wait()
        try:
            await self.backend.leave(self.me)
            return any(other != self.me for other in await self.backend.live_instances())
        except BackendUnavailable:  # not known: handed over, as a kill leaves them (a
            # survivor takes them when their lease lapses, or the next instance to start);
            # ending them `server_shutdown` ended runs another instance could go on with
            logger.warning("drain: could not ask the shared backend which instances live; "
                           "handing the runs over")
            return True

    async def stop(self) -> None:
        # messages waiting for the next owner of a handed-over run: see `Lanes.stop`
        await self._lanes.stop(self.lease_s + TAKEOVER_SLACK_S)
        with contextlib.suppress(BackendUnavailable):
            await self.backend.leave(self.me)
        if self._posts:  # the answers just given (`unavailable`) to other instances' clients
            await asyncio.wait(set(self._posts), timeout=STOP_WAIT_S)
        pending = self._tasks + list(self._posts)
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
        if self.has_lane(document_id):
            record = await self.backend.active_run(document_id)
            if record is None or record.get("run_id") != run_id:
                return False
            self._lanes.queue(document_id, run_id, message, peer)
            return True
        sent = await self.backend.send_to_run_owner(document_id, run_id, message,
                                                    not_to=self.me)
        if sent is None:
            return False
        if not sent:  # what is sent next about the document waits for this one
            self._lanes.queue(document_id, run_id, message, peer)
        return True

    def has_lane(self, document_id: str) -> bool:
        """Whether messages about the document are still on their way from this instance
        (`Lanes`), or this instance is taking its run over (`_held`): a message for a run
        that runs here goes behind them, through this instance's own inbox."""
        return self._lanes.has(document_id) or document_id in self._held

    def post_to_run_owner(self, document_id: str, run_id: str, message: dict[str, Any]
                          ) -> None:
        """`to_run_owner` without waiting (an edit: nobody to answer), after whatever this
        instance forwarded about the document before (`Lanes.queue`)."""
        self._lanes.queue(document_id, run_id, message, None)

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
                await self._on_entry(entry_id, message)
            except Exception:
                logger.exception("inbox message failed: %s", message.get("kind"))
            finally:
                self._lanes.handled(message)

    async def _on_entry(self, entry_id: str, message: dict[str, Any]) -> None:
        """One entry of this instance's inbox, in order. About a run being taken over here:
        held until the previous owner's leftovers are replayed. About a run this
        instance no longer drives (draining: once it is handed over): left for its next
        owner's replay (taken and passed on, it reached that owner after newer messages
        sent to it directly)."""
        if message.get("kind") == "reply":
            await self._dispatch(message)
            return
        document_id, run_id = _about(message)
        here = self._runs_here(document_id, run_id)
        if not here and not self._claimed.is_set():  # a lease this instance may be
            await self._claimed.wait()  # taking: the janitor says which (`_held`)
        held = self._held.get(document_id)
        if held is not None:
            held.append((entry_id, message))
            return
        if here and self.draining:  # its run is being handed over: wait (a lease at most)
            for _ in range(int(self.lease_s / LET_GO_POLL_S)):
                await asyncio.sleep(LET_GO_POLL_S)
                if not (here := self._runs_here(document_id, run_id)):
                    break
        self._idle.clear()  # no wait since the checks: `begin_drain` sees this
        try:
            if not here and await self._moved_on(document_id, run_id):
                return
            await self._act_on_own(entry_id, message)
        finally:
            self._idle.set()

    async def _moved_on(self, document_id: str, run_id: str) -> bool:
        """Whether a message about `run_id`, which this instance does not drive, is left
        for the run's next owner: the run is still active, and this instance's inbox is
        the one its next owner replays (it handed the run over: draining; or it is still
        named the run's owner, having lost it). A message about a run that has ended is
        acted on (the sender of a `tool.result` waits for its answer)."""
        if not run_id:
            return False
        try:
            record = await self.backend.active_run(document_id)
        except BackendUnavailable:
            return False  # act rather than leave it (as before)
        return record is not None and record.get("run_id") == run_id and \
            record.get("status") not in TERMINAL and \
            (self.draining or record.get("owner") == self.me)

    async def _act_on_own(self, entry_id: str, message: dict[str, Any]) -> None:
        """Act on an entry of this instance's inbox once (`_answers_a_call`): an answer
        unless a successor replayed it while this instance stalled after reading it."""
        if _answers_a_call(message) and self._runs_here(*_about(message)):
            if await self._unread(entry_id):
                await self._act(self.me, entry_id, message, applied_first=True)
        else:
            await self._act(self.me, entry_id, message, applied_first=False)

    async def _release(self, document_id: str) -> None:
        """The takeover of the document's run is done and its leftovers replayed: act on
        the entries held meanwhile, in order, and stop holding. A new entry is held
        until the last, since nothing waits between the last check and the end."""
        held = self._held.get(document_id)
        while held:
            entry_id, message = held.popleft()
            try:
                await self._act_on_own(entry_id, message)
            except Exception:
                logger.exception("inbox message failed: %s", message.get("kind"))
        self._held.pop(document_id, None)

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
        """Act on the messages about `run_id` that its previous owner (this instance too,
        which left them while it did not drive the run) left unread, in order."""
        with contextlib.suppress(BackendUnavailable):
            for entry_id, message in await self.backend.unread_messages(owner):
                if message.get("kind") == "reply" or _about(message) != (document_id, run_id):
                    continue
                await self._act(owner, entry_id, message, _answers_a_call(message))
                self._lanes.handled(message)  # one of its own lanes' (the loop may not see it)

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
                    peer = RemotePeer(self, "", "", document_id,  # its sender: `edit_key`
                                      str(message.get("client_id", "")), str(message["user_id"]))
                    await session.runs.on_edit(peer, edit, forwarded=True)
            elif kind in ("supersede", "interrupt"):
                reason = "superseded" if kind == "supersede" else "interrupted"
                await session.runs.abort(message["run_id"], "cancelled", reason)
        finally:
            hub.release(session)

    def _runs_here(self, document_id: str, run_id: str) -> bool:
        """Whether this instance drives `run_id` now. After an outage longer than a lease,
        this instance's own janitor finds its live runs' leases lapsed; taking one "over"
        found the coordinator busy and ended the run (`server_lost`) under its own driver."""
        session = self.hub.sessions.get(document_id)
        return session is not None and session.runs.drives(run_id)
