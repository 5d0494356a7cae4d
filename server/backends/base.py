"""The `Backend` seam: everything a document session shares beyond one process.

Two implementations satisfy it (memory for one process, Redis for several)
and one contract test suite runs against both. The backend owns the
numbering: `append` stamps `seq` (gapless per document) and `ts`, stores the
event in the document log and hands it to every local listener of that
document, in seq order.
"""

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, Protocol

import orjson

from server.records import quick_init

ResumeFailure = Literal["epoch_changed", "history_truncated"]


@dataclass(frozen=True, slots=True)
class RunParts:
    """Entries for a run's append-only parts list (JSON texts), sent with its record;
    `reset` empties the list first."""

    entries: tuple[str, ...]
    reset: bool = False


@quick_init
@dataclass(frozen=True, slots=True)
class LoggedEvent:
    """A durable event as it sits in the log: its number, type and wire text."""

    seq: int
    type: str
    frame: str


class LogHead(NamedTuple):
    epoch: str
    last_seq: int


EventListener = Callable[[LoggedEvent], None]

RUN_RECORDS_MAX = 1000
"""Run records kept per document (the newest by first write); older ones are dropped."""

LogReset = Callable[[str], None]
"""Called with the new epoch when a document's log restarted under it (Redis lost its
data: a restart without persistence, a failover to an empty replica, the key evicted
or deleted): what a listener was given under another epoch no longer lines up."""


class BackendUnavailable(Exception):
    """The shared backend (Redis) cannot be reached; the request may be retried."""


class RunMovedOn(Exception):
    """The run's lease turned out to be another instance's: this one stalled past it and
    a survivor took the run over. Whatever this instance was about to log for the run
    is not its to log."""


class UnloggableEvent(ValueError):
    """The event cannot be serialized (nested too deep for the encoder, an integer
    beyond 64 bits, a non-JSON value). `append` raises it before any seq is taken,
    so the log keeps no trace and no gap; the caller answers the client that
    caused it (`invalid_message` / `internal`), never closing anyone's connection.
    The message is for the server log only: it may quote the encoder."""


def cancel_requested() -> bool:
    """Whether the running task was asked to stop, even if the request got lost.

    On Python 3.11 `asyncio.wait_for` (which redis-py wraps around every socket
    write) returns the result instead of raising when the cancel arrives as the
    write completes: the task goes on with `cancelling()` still above 0. A loop
    that must end when cancelled checks this, or it may run (and block a
    shutdown waiting for it) forever."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def encode_event_body(event: dict[str, Any]) -> bytes:
    """The event's JSON without its closing brace, ready for `,"seq":N,"ts":T}`.

    Serializing first, before a seq exists, is what keeps the log gapless: an
    event that cannot be encoded fails here and never takes a number.
    """
    if not event or "seq" in event or "ts" in event:
        raise UnloggableEvent("an event needs fields and must not carry seq or ts")
    try:
        return orjson.dumps(event)[:-1]
    except orjson.JSONEncodeError as exc:
        raise UnloggableEvent(f"event {event.get('type')!r} cannot be serialized: {exc}") from exc


class RunRegistry(Protocol):
    """What the run engine needs of the shared backend (`server.ports` re-exports it):
    the log's head and tail, run records and history, the document's active run and
    its lease, the run queue, which instances live, executor presence."""

    # True when a call costs a network round trip and other instances share the records
    # (Redis): checkpoints and lease renewals are then worth making, and the session lets
    # the agent go on during an append, merging the deltas that arrive meanwhile.
    remote: bool

    async def head(self, document_id: str) -> LogHead: ...

    async def read_after(
        self, document_id: str, epoch: str, after_seq: int, until_seq: int | None = None
    ) -> list[LoggedEvent] | ResumeFailure:
        """Every event with after_seq < seq <= until_seq (default: the last),
        or why the log cannot provide all of them."""
        ...

    async def append_history(self, document_id: str, entries: list[dict[str, Any]]) -> None:
        """Entries appended in turn; past `HISTORY_MAX_ENTRIES` for the document, each
        evicts the oldest entry of the thread holding the most (memory_history.py), so a
        busy thread cannot push a quiet one out."""
        ...

    async def read_history(self, document_id: str) -> list[dict[str, Any]]:
        """Every kept entry, all threads, in the order appended (callers filter)."""
        ...

    async def put_run_record(self, document_id: str, run_id: str, record: dict[str, Any]) -> None:
        ...

    async def get_run_record(self, document_id: str, run_id: str) -> dict[str, Any] | None: ...

    async def take_run_slot(self, user_id: str, per_minute: int) -> int:
        """0 when a run may start now, else milliseconds until one may."""
        ...

    async def claim_run(self, document_id: str, record: dict[str, Any], lease_s: float
                        ) -> dict[str, Any] | None:
        """Make `record` the document's active run; on conflict return the active one."""
        ...

    async def renew_run(self, document_id: str, record: dict[str, Any], lease_s: float,
                        parts: RunParts | None = None) -> bool:
        """Refresh the lease and snapshot of the owner's run (`record["owner"]`), and append
        `parts` to its checkpoint parts list in the same atomic step; False (nothing
        written) if it is not active or another instance holds its lease now."""
        ...

    async def renew_and_append(self, document_id: str, record: dict[str, Any], lease_s: float,
                               parts: RunParts | None, events: Sequence[dict[str, Any]]
                               ) -> bool:
        """`renew_run`, then `append` of each of `events` (the decision that checkpoint
        announces), as one atomic step; False (nothing written) as for `renew_run`.
        Raises `UnloggableEvent` (nothing written) for content the log cannot hold.
        A shared backend is idempotent per `record["write"]`: once that write is done,
        another attempt of it (its reply was lost) writes nothing and answers True."""
        ...

    async def run_parts(self, document_id: str) -> list[str]:
        """The active run's checkpoint parts list (`server/agent/checkpoint_parts.py`)."""
        ...

    async def hand_off_run(self, document_id: str, record: dict[str, Any]) -> bool:
        """A draining owner's last word on its run: `record` (its final checkpoint) in one
        step with giving the lease up, lapsed at once, so the next janitor takes the run
        over and no late renewal of this owner can overwrite it; False if not its own."""
        ...

    async def release_run(self, document_id: str, run_id: str, owner: str) -> None:
        """Free the document of `run_id` if `owner` (an instance id) holds its lease;
        nothing otherwise (another instance took the run over, or it is not active)."""
        ...

    async def active_run(self, document_id: str) -> dict[str, Any] | None: ...

    async def enqueue_run(self, document_id: str, entry: dict[str, Any], limit: int
                          ) -> int | None:
        """Append `entry` to the document's run queue: its position (1 = next), or None
        when `limit` entries already wait (0: no limit)."""
        ...

    async def queued_runs(self, document_id: str) -> list[dict[str, Any]]: ...

    async def heartbeat(self, instance_id: str, ttl_s: float) -> None: ...

    async def leave(self, instance_id: str) -> None: ...

    async def live_instances(self) -> list[str]:
        """The instances whose heartbeat has not run out (this one included)."""
        ...

    async def remove_queued(self, document_id: str, run_id: str) -> dict[str, Any] | None:
        """Take the queued run `run_id` out of the queue (None if it is not there)."""
        ...

    async def stalled_queues(self, recheck_s: float) -> list[str]:
        """Documents with runs queued and no active run (a few at a time; each is looked
        at again `recheck_s` later): their queue waits for nobody, a janitor starts it.
        An in-process backend has none (the process that ended the run starts it)."""
        ...

    async def is_present(self, document_id: str, user_id: str, client_id: str) -> bool:
        """Whether a connection of the client is open on some live instance. False means
        gone: a shared backend answers True for a while after it reached its store again
        (the other instances' entries may have lapsed during the outage)."""
        ...


class Backend(RunRegistry, Protocol):
    """Everything a document session shares beyond one process: the run registry plus
    the log's appends and fan-out, shared limits, inboxes and presence."""

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def ready(self) -> bool:
        """Whether the backend answers (GET /readyz)."""
        ...

    async def append(self, document_id: str, event: dict[str, Any]) -> LoggedEvent:
        """Serialize the event, then stamp `seq` and `ts`, log it and deliver it to
        listeners. Raises `UnloggableEvent` (nothing logged, no seq used) when the
        event cannot be serialized."""
        ...

    async def append_once(self, document_id: str, event: dict[str, Any], write_id: str
                          ) -> LoggedEvent:
        """`append`, idempotent per `write_id` (unique, the same for every attempt of one
        event) with a shared backend: an append whose reply was lost (it raised
        `BackendUnavailable`, yet was done) logs nothing when tried again and answers the
        first attempt's seq, not delivered again (the first attempt's delivery stands).
        An in-process backend loses no reply: it appends."""
        ...

    async def append_fenced(self, document_id: str, event: dict[str, Any], write_id: str
                            ) -> None:
        """`append_once` of an event of the run `event["run_id"]` only while this instance
        holds that run (checked in the same step with a shared backend); else
        `RunMovedOn`, nothing logged. Held text retried after a failed append: the run may
        have been taken over meanwhile. An in-process backend has no other instance."""
        ...

    async def subscribe(self, document_id: str, listener: EventListener,
                        on_reset: LogReset | None = None) -> None:
        """Deliver every later event of the document to `listener`, in seq order
        (events appended elsewhere may arrive late; readers fill gaps from the log);
        `on_reset` when the log restarts under a new epoch (a shared backend only)."""
        ...

    def unsubscribe(self, document_id: str, listener: EventListener) -> None: ...

    async def claim_once(self, key: str, ttl_s: float) -> bool:
        """True the first time `key` is claimed (single-use call tokens)."""
        ...

    async def acquire_connection(self, user_id: str, connection_id: str, limit: int) -> bool: ...

    async def release_connection(self, user_id: str, connection_id: str) -> None: ...

    async def expired_runs(self, claimer: str, lease_s: float = 10.0
                           ) -> list[tuple[str, dict[str, Any]]]:
        """Active runs whose owner stopped renewing, each handed to one caller only,
        `claimer`, which holds their lease for `lease_s` from now (to take them over or
        end them); each record still names the owner that lost it."""
        ...

    async def send(self, instance_id: str, message: dict[str, Any]) -> None:
        """Durably queue `message` for an instance (its inbox)."""
        ...

    async def send_to_run_owner(self, document_id: str, run_id: str, message: dict[str, Any],
                                not_to: str = "", park: bool = False) -> str | None:
        """Queue `message` for whoever holds the lease of the document's active run
        `run_id`, read in the same atomic step as the send (a takeover falls wholly
        before or after it): that holder's id; "" with nothing sent while nobody but
        `not_to` holds it (a handoff under way); None when `run_id` is not active.
        With `park`, a message nobody else holds the run for goes to `not_to`'s own
        inbox in that same step when the run's record names `not_to` as its owner (it
        handed the run over, nobody took it yet), and `not_to` is returned: the next
        owner replays that inbox after taking the lease (`Lanes._park`), so no takeover
        falls between the check and the send."""
        ...

    def inbox(self, instance_id: str) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """The instance's messages in order, each with its entry id."""
        ...

    async def has_message(self, instance_id: str, entry_id: str) -> bool:
        """Whether the entry is still in the instance's inbox (nobody took it yet)."""
        ...

    async def take_message(self, instance_id: str, entry_id: str) -> bool:
        """Claim an inbox entry before acting on it: True for one caller only (the
        instance itself, or the next owner of a run whose owner left it unread)."""
        ...

    async def unread_messages(self, instance_id: str) -> list[tuple[str, dict[str, Any]]]:
        """The entries still in an instance's inbox (sent, not yet claimed)."""
        ...

    async def set_presence(self, document_id: str, member: str, present: bool) -> None:
        """`member` is "user|client|connection"; presence outlives no instance."""
        ...


ENDED_LOOKBACK = 64
"""Events `run_ended_in_log` reads back: a run's owner frees its record right after
logging `run.finished`, so only the few events logged in between can follow it."""


async def run_ended_in_log(registry: RunRegistry, document_id: str, run_id: str,
                           lookback: int = ENDED_LOOKBACK) -> str | None:
    """The status of `run_id`'s `run.finished` if it is among the document's last
    `lookback` events, else None."""
    head = await registry.head(document_id)
    tail = await registry.read_after(document_id, head.epoch,
                                     max(0, head.last_seq - lookback), head.last_seq)
    for event in tail if isinstance(tail, list) else ():
        if event.type == "run.finished":
            frame = orjson.loads(event.frame)
            if frame.get("run_id") == run_id:
                return str(frame.get("status"))
    return None
