"""A document session: the connections of one document on this instance.

It receives every durable event of its document from the backend and hands it to
each connection's writer; it routes parsed client messages to the run coordinator;
it publishes events, merging consecutive `message.delta`s of a message before they
are logged (PROTOCOL.md section 3: one event live and on replay) while the stream
is saturated: deltas arriving back to back (faster than the writers get to run),
or a connection with a send pending. A delta after a quiet gap is logged at once.
"""

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence

import orjson

from protocol.base import PROTOCOL_VERSION
from protocol.client import ClientMessage, EditorChange, Hello
from protocol.codes import CloseCode
from protocol.server import (
    ChangeSpan,
    DocumentChanged,
    DurableServerEvent,
    Limits,
    MessageDelta,
    Welcome,
)
from server.agent.edits import edit_key
from server.agent.wire_events import LoggedEventSource, WireEvent
from server.backends.base import (
    Backend,
    BackendUnavailable,
    LoggedEvent,
    ResumeFailure,
    UnloggableEvent,
    encode_event_body,
)
from server.connection import Connection
from server.log_groups import DecisionCheckpoint, HeldText, append_group, append_held
from server.outbound import _Frame
from server.ports import RunHandler

logger = logging.getLogger("cowrite.session")

COALESCE_MAX_CHARS = 4096
# Deltas of one message less than HOT_S apart arrive faster than a loop iteration
# or two: the stream is "hot" and its text is merged while it keeps coming, for up
# to HOT_SPINS loop iterations. A delta after a quieter gap is logged at once, so a
# paced stream (or a model's first token) is never held back.
HOT_S = 0.0005
HOT_SPINS = 64
# Text held because a connection is backed up is logged after HOLD_MAX_S at the latest:
# one client that stops reading (still under the slow-consumer bound) held every
# other client's text until the message was done.
HOLD_MAX_S = 0.05


# The client ids of the adapters' frontends (`<kind>:<chat>`, server/adapters/chat.py).
PER_REQUEST_CLIENTS = ("ai-sdk:", "agui:")


def _member(conn: Connection) -> str:
    """A connection's presence entry: who executes the document's client tools."""
    return f"{conn.user_id}|{conn.client_id}|{conn.session_id}"


def _encoded(event: LoggedEventSource) -> tuple[str, bytes]:
    """The event's type and its body for the log (`encode_event_body`), or `UnloggableEvent`.
    A `WireEvent` was encoded when it was made (the round trip's; `wire_events`)."""
    if type(event) is WireEvent:
        return event.type, event.json[:-1]
    try:
        wire = event.to_wire()
    except (TypeError, ValueError) as exc:  # an encoder refused the content
        raise UnloggableEvent(str(exc)) from exc
    return str(wire["type"]), encode_event_body(wire)


class DocumentSession:
    def __init__(
        self,
        document_id: str,
        backend: Backend,
        limits: Limits,
        make_runs: Callable[["DocumentSession"], RunHandler],
        features: Sequence[str] = (),
    ) -> None:
        self.document_id = document_id
        self.backend = backend
        self.limits = limits
        self.features = list(features)
        self.connections: dict[str, Connection] = {}
        self._subscribed = False
        self._pending: HeldText | None = None
        # Held text whose append failed: it may be logged (the reply was lost), so it is
        # tried again first, as it was (the same write id), and nothing joins it.
        self._unsure: HeldText | None = None
        self._fenced = ""  # the run whose held text failed: fenced from then (append_held)
        self._last_delta_at = 0.0
        self._publish_lock = asyncio.Lock()
        self._flush_tasks: set[asyncio.Task[None]] = set()
        self._hold_timer: asyncio.TimerHandle | None = None
        # An in-process log's append as a plain call (`MemoryBackend.append_encoded`).
        self._append_encoded: Callable[[str, str, bytes], LoggedEvent] | None = \
            None if backend.remote else getattr(backend, "append_encoded", None)
        self.remote = backend.remote  # an `EventLog`'s
        self.runs = make_runs(self)

    # -- membership ------------------------------------------------------------
    async def attach(self, conn: Connection) -> None:
        self.connections[conn.session_id] = conn
        if not self._subscribed:
            self._subscribed = True
            await self.backend.subscribe(self.document_id, self._on_event, self._log_reset)
        await self.backend.set_presence(self.document_id, _member(conn), True)

    async def detach(self, conn: Connection) -> None:
        self.connections.pop(conn.session_id, None)
        self.on_writer_idle()  # text held for it goes to the others now
        self.runs.presence_changed()
        with contextlib.suppress(BackendUnavailable):
            await self.backend.set_presence(self.document_id, _member(conn), False)

    @property
    def idle(self) -> bool:
        """No connection and no run: the hub may forget this session."""
        return not self.connections and not self.runs.busy

    def shutdown(self) -> None:
        if self._subscribed:
            self.backend.unsubscribe(self.document_id, self._on_event)
            self._subscribed = False

    def connections_of(self, user_id: str) -> list[Connection]:
        return [c for c in self.connections.values() if c.user_id == user_id]

    def has_client(self, user_id: str, client_id: str) -> bool:
        """Whether the client (a run's executor) is connected to this instance. An
        adapter's frontend (`PER_REQUEST_CLIENTS`) counts as present: it attaches per
        request, so it is absent between requests by design (after its link was lost,
        on the instance its run moved to), and the tool and approval timeouts bound its
        waits; the client grace ended a run whose user read an approval prompt through
        a rolling deploy after 30 s."""
        return client_id.startswith(PER_REQUEST_CLIENTS) or any(
            c.client_id == client_id and c.user_id == user_id
            for c in self.connections.values())

    async def join(self, conn: Connection, hello: Hello) -> Welcome:
        """Attach `conn` and queue its welcome, its replay, then live events."""
        await self.attach(conn)
        head = await self.backend.head(self.document_id)
        failure: ResumeFailure | None = None
        replay: list[LoggedEvent] = []
        start_seq = head.last_seq
        if hello.resume is not None:
            result = await self.backend.read_after(
                self.document_id, hello.resume.epoch, hello.resume.after_seq, head.last_seq
            )
            if isinstance(result, list):
                replay, start_seq = result, hello.resume.after_seq
            else:
                failure = result
        welcome = Welcome(
            protocol=PROTOCOL_VERSION,
            session_id=conn.session_id,
            document_id=self.document_id,
            user_id=conn.user_id,
            client_id=conn.client_id,
            role=conn.principal.role,
            epoch=head.epoch,
            last_seq=head.last_seq,
            resumed=hello.resume is not None and failure is None,
            resume_failed=failure,
            replayed=len(replay),
            active_run=await self.runs.snapshot(conn.user_id),
            queued_runs=await self.runs.queued(),
            limits=self.limits,
            features=self.features,
        )
        conn.epoch = head.epoch
        conn.outbound.begin(_Frame("welcome", welcome.to_json().decode()), start_seq, replay)
        self.runs.presence_changed()
        return welcome

    async def backfill(self, after: int, until: int) -> list[LoggedEvent] | None:
        """Events after..until of the log, for a writer filling a gap (None when
        they are gone). A bound method of the session, not a closure per
        connection: each idle connection's writer holds less."""
        head = await self.backend.head(self.document_id)
        result = await self.backend.read_after(self.document_id, head.epoch, after, until)
        return result if isinstance(result, list) else None

    # -- inbound ---------------------------------------------------------------
    async def handle(self, conn: Connection, message: ClientMessage) -> None:
        if isinstance(message, EditorChange):
            await self.editor_changed(conn, message)
        else:
            await self.runs.handle(conn, message)

    async def editor_changed(self, conn: Connection, message: EditorChange) -> None:
        """The run decides, then `document.changed` is logged. Either may fail
        `unavailable`, and the client sends the edit again under its `id`: the run
        applies it once (`RunState.edit_keys`), and the log has it once (its write id:
        an append whose reply was lost is not done twice)."""
        await self.runs.on_edit(conn, message)
        key = None if message.id is None else edit_key(conn.client_id, message.to_wire())
        await self.publish(DocumentChanged(
            document_version=message.document_version, user_id=conn.user_id,
            client_id=conn.client_id, origin=message.origin, changes=None if
            message.changes is None else [ChangeSpan(**{"from": c.from_, "to": c.to,
                                                         "insert": c.insert})
                                           for c in message.changes]),
            write_id="" if key is None else f"edit.{key}")
        if message.id is not None:
            conn.ack(message.id)

    # -- outbound --------------------------------------------------------------
    def _log_reset(self, epoch: str) -> None:
        """Redis lost the log these connections follow: each resumes (`epoch_changed`).
        A connection welcomed under the new epoch already follows the new log."""
        for conn in list(self.connections.values()):
            if conn.epoch != epoch:
                conn.close(CloseCode.INTERNAL_ERROR, "document log reset", drop_pending=True)

    def _on_event(self, event: LoggedEvent) -> None:
        for conn in self.connections.values():
            conn.outbound.push_event(event)
        if event.type == "run.finished":
            self.runs.saw_run_end(orjson.loads(event.frame)["run_id"])

    def _backlogged(self) -> bool:
        for conn in self.connections.values():
            if conn.outbound.has_pending_send:
                return True
        return False

    async def publish(self, event: DurableServerEvent, write_id: str = ""
                      ) -> LoggedEvent | None:
        """Log and fan out `event` (after any delta held back for merging); with a
        `write_id`, once however many attempts reach the log (`Backend.append_once`)."""
        if isinstance(event, MessageDelta):
            await self.publish_delta(event.run_id, event.message_id, event.delta)
            return None
        async with self._publish_lock:
            await self._flush_locked()
            if write_id:
                return await self.backend.append_once(self.document_id, event.to_wire(),
                                                      write_id)
            return await self.backend.append(self.document_id, event.to_wire())

    async def publish_many(self, events: Sequence[LoggedEventSource],
                           checkpoint: DecisionCheckpoint | None = None) -> None:
        """Log `events` as one group, in order (after any delta held back for merging).

        Either the whole group is logged or, if the first event could not be, none
        of it: every event is encoded before the first is appended, so content the
        log cannot hold is refused up front (`UnloggableEvent`). A backend outage
        in the middle of a group is retried for a while before giving up. A group
        with its decision's `checkpoint` is written with it in one step (log_groups).
        An in-process log appends as plain calls that never wait nor fail midway: each
        event is encoded once, up front, and logged without a coroutine per append."""
        append_encoded = self._append_encoded
        if append_encoded is not None and checkpoint is None:
            encoded = [_encoded(event) for event in events]
            if self._pending is not None or self._publish_lock.locked():
                async with self._publish_lock:  # appended right after: no await between
                    await self._flush_locked()
            for kind, body in encoded:
                append_encoded(self.document_id, kind, body)
            return
        try:
            wires = [event.to_wire() for event in events]
            if len(wires) > 1:
                for wire in wires:
                    orjson.dumps(wire)
        except (TypeError, ValueError) as exc:  # an encoder refused the content
            raise UnloggableEvent(str(exc)) from exc
        async with self._publish_lock:
            await self._flush_locked()
            await append_group(self.backend, self.document_id, wires, checkpoint)

    def publish_now(self, events: Sequence[WireEvent]) -> bool:
        """`publish_many` of encoded events an in-process log appends at once; else False."""
        append_encoded = self._append_encoded
        if append_encoded is None or self._pending is not None or self._publish_lock.locked():
            return False
        for event in events:
            append_encoded(self.document_id, event.type, event.json[:-1])
        return True

    async def publish_delta(self, run_id: str, message_id: str, delta: str) -> None:
        """The hot path: no model object per delta. A delta is logged at once when
        the document is quiet; it is held and merged with the next ones (before
        logging, so live and replay see the same events) while deltas arrive back
        to back (`HOT_S`: the producer outpaces the event loop), while a connection
        is backed up, or (remote backend) while the previous append is in flight."""
        pending = self._pending
        if pending is not None:
            if pending.message_id == message_id and pending.run_id == run_id:
                pending.parts.append(delta)
                pending.size += len(delta)
                self._last_delta_at = time.monotonic()
                if pending.size >= COALESCE_MAX_CHARS or self.backend.remote:
                    self._schedule_flush()
                return
            await self.flush()  # another message's text goes first
        now = time.monotonic()
        hot, self._last_delta_at = now - self._last_delta_at < HOT_S, now
        if hot or self.backend.remote or self._backlogged():
            pending = self._pending = HeldText(run_id, message_id)
            pending.parts.append(delta)
            pending.size = len(delta)
            self._schedule_flush()
            return
        async with self._publish_lock:
            await self._flush_locked()
            await self.backend.append(self.document_id, {
                "type": "message.delta", "run_id": run_id, "message_id": message_id,
                "delta": delta})

    async def flush(self) -> None:
        async with self._publish_lock:
            await self._flush_locked()

    async def _flush_until_empty(self) -> None:
        """Log the held text once it stops growing: yield to the loop while the
        producer keeps adding (at most `HOT_SPINS` times, `COALESCE_MAX_CHARS`
        characters), and leave it to `on_writer_idle` while a connection is backed
        up. With Redis, an append in flight is the wait (no spinning)."""
        spins = 0
        while (pending := self._pending) is not None:
            full = pending.size >= COALESCE_MAX_CHARS
            if not full and self._backlogged():
                held = time.monotonic() - pending.since
                if held < HOLD_MAX_S:  # on_writer_idle() schedules the flush again,
                    if self._hold_timer is None:  # or this timer at the latest
                        self._hold_timer = asyncio.get_running_loop().call_later(
                            HOLD_MAX_S - held, self._hold_over)
                    return
            if not full and not self.backend.remote and spins < HOT_SPINS:
                size = pending.size
                await asyncio.sleep(0)
                spins += 1
                if self._pending is pending and pending.size != size:
                    continue  # still growing
                if self._pending is not pending:
                    spins = 0
                    continue
            await self.flush()
            spins = 0

    async def _flush_locked(self) -> None:
        if self._unsure is not None:
            await self._append_held(self._unsure)
            self._unsure = None
        pending, self._pending = self._pending, None
        if pending is not None and pending.parts:
            try:
                await self._append_held(pending)
            except UnloggableEvent:  # it never will be: kept, it failed every later flush
                raise
            except BaseException:
                self._unsure = pending  # for the next attempt; text since goes after it
                self._fenced = pending.run_id
                raise

    async def _append_held(self, held: HeldText) -> None:
        if not self.backend.remote:  # an in-process log loses no reply
            await self.backend.append(self.document_id, held.wire())
            return
        await append_held(self.backend, self.document_id, held,
                          fenced=held.run_id == self._fenced)

    def _hold_over(self) -> None:
        self._hold_timer = None
        self._schedule_flush()

    def on_writer_idle(self) -> None:
        if self._pending is not None and not self._backlogged():
            self._schedule_flush()

    def _schedule_flush(self) -> None:
        if self._flush_tasks:
            return
        task = asyncio.get_running_loop().create_task(self._flush_until_empty())
        self._flush_tasks.add(task)
        task.add_done_callback(self._flush_done)

    def _flush_done(self, task: asyncio.Task[None]) -> None:
        self._flush_tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error(
                "flushing coalesced deltas failed", exc_info=task.exception(),
                extra={"document_id": self.document_id},
            )
        elif self._pending is not None and not self._backlogged():
            self._schedule_flush()  # a delta arrived as the flusher was finishing
