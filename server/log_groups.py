"""Appending a group of a run's events to a document's log (`DocumentSession.publish_many`).

A group is logged in order; after its first event, an outage is retried for a
while, so a group is not left half logged by a blip. A group that carries its
decision's checkpoint (`DecisionCheckpoint`, Redis) is written with it in one
atomic step: an owner killed between writing the checkpoint and logging the
events used to leave a survivor a run whose announcements were never logged.
Kept apart from session.py, which holds the fan-out and the delta merging.

A shared log's append whose reply is lost may have happened: every event is
appended under a write id (`Backend.append_once`), the same for each attempt of it,
so an attempt after such an outage logs nothing twice (a second `run.finished`).
The attempts of one group inside `one_write` (a caller's retry loop) are one
write: the group's events get the same ids each time. Inside `same_write(id)` that
write is `id`: a decision's checkpointed write (its record's `write`, its events
`<id>.<n>`, RENEW_AND_APPEND_LUA) and its plain group append after Redis lost the run
are then one write, whichever of them reaches Redis first.
"""

import asyncio
import contextlib
import itertools
import logging
import time
import uuid
from contextvars import ContextVar
from typing import Any, Protocol

from server.backends.base import (
    Backend,
    BackendUnavailable,
    RunMovedOn,
    RunParts,
    UnloggableEvent,
)

logger = logging.getLogger("cowrite.session")
GROUP_RETRY_S = 3.0
_PROCESS = uuid.uuid4().hex[:10]  # write ids: unique across instances without a uuid each
_counter = itertools.count(1)
_GROUP_WRITE: ContextVar[str] = ContextVar("cowrite_group_write", default="")
_SAME_WRITE: ContextVar[str] = ContextVar("cowrite_same_write", default="")


def new_write_id() -> str:
    return f"{_PROCESS}{next(_counter):x}"


class _OneWrite:
    __slots__ = ("_token",)

    def __enter__(self) -> None:
        self._token = _GROUP_WRITE.set(_SAME_WRITE.get() or new_write_id())

    def __exit__(self, *exc: object) -> None:
        _GROUP_WRITE.reset(self._token)


_IN_PROCESS = contextlib.nullcontext()


def one_write(remote: bool) -> contextlib.AbstractContextManager[None]:
    """Every attempt to log a group (`append_group`) inside is the same write: its events
    keep their write ids, so the ones an earlier attempt logged are not logged again.
    An in-process log (`remote` false) loses no reply: nothing to set (a generator-based
    context manager here cost every client tool round trip ~2%)."""
    return _OneWrite() if remote else _IN_PROCESS


class _SameWrite:
    __slots__ = ("_token", "_write_id")

    def __init__(self, write_id: str) -> None:
        self._write_id = write_id

    def __enter__(self) -> None:
        self._token = _SAME_WRITE.set(self._write_id)

    def __exit__(self, *exc: object) -> None:
        _SAME_WRITE.reset(self._token)


def same_write(write_id: str) -> contextlib.AbstractContextManager[None]:
    """Inside, a group's write (`one_write`) is `write_id` (none given: its own): the
    events of a decision whose checkpointed write was refused (Redis lost the run) are
    logged under its ids, so however the decision's end is tried after (a checkpointed
    write again, through an outage: `commit.py`), each event is logged once. No id (an
    in-process log, every decision's usual path): nothing to set, at no cost (a
    generator-based context manager here cost the round trip 3%; performance.md)."""
    return _SameWrite(write_id) if write_id else _IN_PROCESS


class LeaseNotHeld(Exception):
    """The checkpoint of a group was refused (another instance holds the run's lease,
    or Redis lost the run): none of the group was logged."""


class DecisionCheckpoint(Protocol):
    """A decision's checkpoint as the run's lease prepares it (`RunLease.decision_write`)."""

    def begin(self) -> tuple[dict[str, Any], float, RunParts | None]:
        """The record, the lease, the parts to append; called for each attempt."""
        ...

    def end(self, written: bool | None) -> None:
        """Written, refused (False), or unknown (None: the backend failed midway)."""
        ...


async def append_group(backend: Backend, document_id: str, wires: list[dict[str, Any]],
                       checkpoint: DecisionCheckpoint | None = None) -> None:
    if checkpoint is not None:
        try:
            record, lease_s, parts = checkpoint.begin()
            written = await backend.renew_and_append(document_id, record, lease_s, parts, wires)
        except BackendUnavailable:
            checkpoint.end(None)
            raise
        except UnloggableEvent:  # an event: nothing written
            checkpoint.end(False)
            raise
        except (TypeError, ValueError):  # the checkpoint only (deeper than its events):
            checkpoint.end(False)  # skipped, as a renewal skips it; the events alone
            logger.warning("checkpoint skipped: it cannot be encoded",
                           extra={"document_id": document_id})
        else:
            checkpoint.end(written)
            if not written:
                raise LeaseNotHeld(document_id)
            return
    group = (_GROUP_WRITE.get() or new_write_id()) if backend.remote else ""
    for index, wire in enumerate(wires):
        try:
            await _append_retrying(backend, document_id, wire, retry=index > 0,
                                   write_id=group and f"{group}.{index}")
        except (TypeError, ValueError) as exc:
            raise UnloggableEvent(str(exc)) from exc


async def _append_retrying(backend: Backend, document_id: str, wire: dict[str, Any],
                           retry: bool, write_id: str) -> None:
    deadline = time.monotonic() + GROUP_RETRY_S
    while True:
        try:
            if write_id:
                await backend.append_once(document_id, wire, write_id)
            else:  # an in-process log loses no reply
                await backend.append(document_id, wire)
            return
        except BackendUnavailable:
            if not retry or time.monotonic() > deadline:
                if retry:
                    logger.error("the rest of an event group could not be logged",
                                 extra={"document_id": document_id})
                raise
            await asyncio.sleep(0.05)


class HeldText:
    """A message's text held back for merging (`DocumentSession.publish_delta`)."""

    __slots__ = ("message_id", "parts", "run_id", "since", "size", "write_id")

    def __init__(self, run_id: str, message_id: str) -> None:
        self.run_id = run_id
        self.message_id = message_id
        self.parts: list[str] = []
        self.size = 0
        self.since = time.monotonic()
        self.write_id = ""  # set at its first append (a remote log's)

    def wire(self) -> dict[str, Any]:
        return {"type": "message.delta", "run_id": self.run_id,
                "message_id": self.message_id, "delta": "".join(self.parts)}


async def append_held(backend: Backend, document_id: str, held: HeldText, fenced: bool
                      ) -> None:
    """Held text on a shared log, under its write id (each attempt the same: a lost
    reply, retried, logs it once). `fenced` after an append of its run's text failed:
    the run may have been taken over meanwhile (an outage longer than its lease), so
    the text is logged only while this instance holds the run, checked in the same
    step (`Backend.append_fenced`), else dropped: the new owner discarded that
    message. It was logged at the session's next flush: the old owner's own retry of
    the run's end, or a person's edit there, put it after the run's `run.finished`."""
    held.write_id = held.write_id or new_write_id()
    if not fenced:
        await backend.append_once(document_id, held.wire(), held.write_id)
        return
    try:
        await backend.append_fenced(document_id, held.wire(), held.write_id)
    except RunMovedOn:
        logger.warning("held text dropped: its run is another instance's now",
                       extra={"document_id": document_id, "run_id": held.run_id})
