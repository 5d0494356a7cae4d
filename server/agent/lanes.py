"""Messages on their way from this instance to a run's owner: one lane per document.

A change list is in the coordinates the previous edit left, and a `tool.result`
must reach the run after the edits its tab made before it: so the messages
about a document that this instance forwards go one after another, each once
the one before it is in the owner's inbox. While the run changes hands (a
handoff, or this instance let it go) the lane waits for the next holder, then
goes on, in order. See `remote.py` for the rest of the cluster link.
"""

import asyncio
import collections
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from protocol.codes import ErrorCode
from server.backends.base import Backend, BackendUnavailable
from server.connection import Peer

logger = logging.getLogger("cowrite.remote")
# How long a message waits for a run's next owner. A takeover takes a lease and a
# janitor tick, but on a starved machine (every process on one core, a new instance
# importing) it took longer than 3 s in the rolling-restart test: giving up then
# made the client answer twice or, if it does not retry, time the call out.
DELIVERY_WAIT_LEASES, DELIVERY_WAIT_SLACK_S = 3, 10.0
TAKEOVER_POLL_S = 0.05
STOP_WAIT_S = 2.0
RETRY_AFTER_MS = 1000
_Queued = tuple[str, dict[str, Any], Peer | None]  # run id, message, who waits for an answer


def _reply_to(message: dict[str, Any]) -> Any:
    return (message.get("message") or {}).get("id")


class Lanes:
    """The router's outgoing lanes. `here(document_id, run_id)`: whether a message about
    that run goes to this instance's own inbox (it runs the run, or is taking it over:
    behind what it was sent before, see `RunRouter._held`)."""

    def __init__(self, backend: Backend, instance_id: str, lease_s: float,
                 here: Callable[[str, str], bool]) -> None:
        self.backend = backend
        self.me = instance_id
        self.lease_s = lease_s
        self._here = here
        self._lanes: dict[str, collections.deque[_Queued]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        # per document, the marks of messages sent to this instance's own inbox and not
        # dealt with yet, with when they were sent (see `_send`)
        self._in_inbox: dict[str, dict[str, float]] = {}
        self._stopping = False  # `stop`: nothing waits for a takeover any more
        self.parked = self.dropped = 0  # edits: left in this inbox (`_park`), dropped

    def has(self, document_id: str) -> bool:
        """Whether messages about the document are on their way from this instance: in a
        lane, or sent by one to this instance's own inbox and not yet dealt with there."""
        if document_id in self._lanes:
            return True
        marks = self._in_inbox.get(document_id)
        if not marks:
            return False
        # One not dealt with within a lease was taken by another instance's replay (this
        # one stalled and lost the run): it will never be, so it holds nothing back.
        stale = time.monotonic() - self.lease_s
        for mark in [mark for mark, sent in marks.items() if sent < stale]:
            del marks[mark]
        if not marks:
            del self._in_inbox[document_id]
        return bool(marks)

    def handled(self, message: dict[str, Any]) -> None:
        """An entry of this instance's own inbox (`_send`) was dealt with (by the inbox
        loop, or a replay: either may come first, both may come)."""
        mark = message.get("lane")
        document_id = str(message.get("document_id"))
        marks = self._in_inbox.get(document_id)
        if isinstance(mark, str) and marks is not None:
            marks.pop(mark, None)
            if not marks:
                del self._in_inbox[document_id]

    async def _send(self, document_id: str, run_id: str, message: dict[str, Any]
                    ) -> str | None:
        """One attempt (`Backend.send_to_run_owner`): to the run's holder or, the run
        taken over by this instance meanwhile, to its own inbox, behind what it was sent
        before (applied at once, an edit overtook the ones the lane had just put
        there). Such a message is marked until the inbox loop (or a replay) has dealt
        with it (`has`): a local edit goes behind it too."""
        here = self._here(document_id, run_id)
        mark = f"{self.me}:{uuid.uuid4().hex}" if here else ""
        if here:  # marked before it is sent: the inbox loop may deal with it first
            self._in_inbox.setdefault(document_id, {})[mark] = time.monotonic()
        sent: str | None = ""
        try:
            sent = await self.backend.send_to_run_owner(
                document_id, run_id, {**message, "lane": mark} if here else message,
                not_to="" if here else self.me)
        finally:
            if here and sent != self.me:  # not in this inbox after all
                self.handled({"lane": mark, "document_id": document_id})
        return sent

    def queue(self, document_id: str, run_id: str, message: dict[str, Any],
              peer: Peer | None) -> None:
        """Send `message` after the document's messages still on their way, in order.
        Sent by one task each, edits raced on the Redis pool and reached the owner out
        of order, which judged an edit nowhere near the run's scope as touching it and
        aborted the run."""
        lane = self._lanes.get(document_id)
        if lane is None:
            lane = self._lanes[document_id] = collections.deque()
            task = asyncio.get_running_loop().create_task(self._send_lane(document_id, lane))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
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
        try:
            sent = await self._send(document_id, run_id, message)
        except BackendUnavailable:
            sent = ""  # tried again for as long as a takeover is waited for
        if sent == "":
            await self._after_takeover(document_id, run_id, message, peer)
        elif sent is None and peer is not None:  # it ended while queued
            peer.error(ErrorCode.RUN_NOT_ACTIVE, f"run {run_id!r} has finished",
                       reply_to=_reply_to(message), run_id=run_id)

    async def _after_takeover(self, document_id: str, run_id: str, message: dict[str, Any],
                              peer: Peer | None) -> None:
        """Send `message` once another instance holds the run, or this one runs it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.lease_s * DELIVERY_WAIT_LEASES + DELIVERY_WAIT_SLACK_S
        while loop.time() < deadline and not self._stopping:
            await asyncio.sleep(TAKEOVER_POLL_S)
            try:
                sent = await self._send(document_id, run_id, message)
            except BackendUnavailable:
                continue
            if sent is None:
                if peer is not None:
                    peer.error(ErrorCode.RUN_NOT_ACTIVE, f"run {run_id!r} has finished",
                               reply_to=_reply_to(message), run_id=run_id)
                return
            if sent:
                return
        if peer is not None:  # its client sends it again (to an instance that lives)
            peer.error(ErrorCode.UNAVAILABLE, "the run is moving to another instance; "
                       "retry shortly", reply_to=_reply_to(message), run_id=run_id,
                       retry_after_ms=RETRY_AFTER_MS)
        elif self._stopping and await self._park(document_id, run_id, message):
            self.parked += 1
        else:
            self.dropped += 1
            if not self._stopping:
                logger.warning("an edit waited for its run's next owner in vain; dropped",
                               extra={"document_id": document_id, "run_id": run_id})

    async def stop(self, wait_s: float) -> None:
        """Shutting down: give the lanes `wait_s` (a handed-over run's next owner takes it
        within a lease and a janitor tick), then stop waiting for a takeover. A message
        left with a waiting sender (a `tool.result`, an `approval`) is refused
        `unavailable`, so its client sends it again; an edit is left in this instance's
        own inbox when its run is one this instance handed over and nobody has taken
        yet (whoever takes the run acts on what its previous owner left unread, in
        order, after it), else dropped; both counted in a warning."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=wait_s)
        self._stopping = True
        before = self.parked, self.dropped
        if self._tasks:  # they give up at once now; bounded, whatever a library does with
            _, stuck = await asyncio.wait(set(self._tasks), timeout=STOP_WAIT_S)  # a cancel
            for run_id, message, peer in [item for lane in self._lanes.values()
                                          for item in lane] if stuck else ():
                if peer is not None:
                    peer.error(ErrorCode.UNAVAILABLE, "this server is shutting down; retry "
                               "shortly", reply_to=_reply_to(message), run_id=run_id,
                               retry_after_ms=RETRY_AFTER_MS)
                else:
                    self.dropped += 1
            for task in stuck:
                task.cancel()
        parked, dropped = self.parked - before[0], self.dropped - before[1]
        if parked or dropped:
            logger.warning("shutting down: %d edit(s) still waited for their run's next "
                           "owner: %d handed on (to its holder, or left in this instance's "
                           "inbox for it), %d dropped", parked + dropped, parked, dropped)

    async def _park(self, document_id: str, run_id: str, message: dict[str, Any]) -> bool:
        """Deliver an edit one last time: to the run's holder or, for a run that this
        instance handed over and nobody holds yet, into its own inbox, which the next
        owner's replay reads. One atomic step (`send_to_run_owner`'s `park`): checked,
        then sent, a successor could take the run and replay this inbox in between,
        and the edit was never read. False when it could not be delivered (the run has
        ended: nothing to tell; or the backend is away)."""
        with contextlib.suppress(BackendUnavailable):
            return bool(await self.backend.send_to_run_owner(document_id, run_id, message,
                                                             not_to=self.me, park=True))
        return False
