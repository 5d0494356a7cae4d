"""Logging a decision's events for the run driver, with its two failure policies.

A refusable decision (a client's `tool.result` or `approval`, the start) is
tried once and a failure becomes the code its sender is answered with; any
other decision is committed already, so its events are retried through a
backend outage for a while, like an outbox, and only then fail the run.
Kept apart from `driver.py` so the driver holds the order of effects only.
"""

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from protocol.codes import ErrorCode
from server.agent.work import new_ref
from server.backends.base import BackendUnavailable, UnloggableEvent
from server.log_groups import DecisionCheckpoint, LeaseNotHeld, one_write
from server.ports import EventLog

logger = logging.getLogger("cowrite.agent")
PUBLISH_RETRY_MAX_S = 1.0
OUTCOME_RETRY_S = 1.0  # see `try_publish`


class PublishFailed(Exception):
    """A committed decision's events could not be logged: `why`, with a `ref` for the log."""

    def __init__(self, ref: str, why: str, cause: Exception) -> None:
        super().__init__(why)
        self.ref, self.why, self.cause = ref, why, cause


async def try_publish(log: EventLog, events: tuple[Any, ...], extra: Mapping[str, Any],
                      checkpoint: DecisionCheckpoint | None = None
                      ) -> tuple[ErrorCode, str] | None:
    """Log `events` once; None, or the error to answer the sender with. `LeaseNotHeld`
    (the checkpoint's) is raised: the run is not this instance's any more. A write with
    its checkpoint is tried again for up to `OUTCOME_RETRY_S` after an outage: its reply
    may be what was lost, and it is idempotent, so the retry tells whether it happened
    (the sender was told to retry a write that had happened, and its retry logged a
    second `tool.done`)."""
    with one_write(log.remote):  # each attempt logs the events under the same write ids
        return await _attempts(log, events, extra, checkpoint)


PublishNow = Callable[[Sequence[Any]], bool]
"""An in-process log's `publish_now` (`DocumentSession.publish_now`)."""


def refusal(exc: Exception, extra: Mapping[str, Any]) -> tuple[ErrorCode, str]:
    """What a refusable decision's sender is told when logging its group raised `exc`
    (`try_publish`, and the driver's plain-call publish, `CommitMixin._logged_now`)."""
    if isinstance(exc, UnloggableEvent):
        return ErrorCode.INVALID_MESSAGE, "the message's content cannot be logged " \
                                          "(nested too deeply?)"
    ref = new_ref()
    logger.error("publishing failed (ref %s)", ref, extra=extra, exc_info=exc)
    return ErrorCode.INTERNAL, f"internal error (ref {ref})"


def unloggable(exc: UnloggableEvent, extra: Mapping[str, Any]) -> PublishFailed:
    """A committed decision's group that can never be logged, as `publish_retrying`
    fails it (and the driver's plain-call publish)."""
    ref = new_ref()
    logger.error("an event of the run cannot be logged (ref %s)", ref, extra=extra)
    return PublishFailed(ref, "unloggable", exc)


async def _attempts(log: EventLog, events: tuple[Any, ...], extra: Mapping[str, Any],
                    checkpoint: DecisionCheckpoint | None) -> tuple[ErrorCode, str] | None:
    deadline, delay = 0.0, 0.05  # the deadline is read on the first outage only: every
    while True:  # client answer passes here
        try:
            await log.publish_many(events, checkpoint)
            return None
        except BackendUnavailable:
            if checkpoint is None:
                break
            deadline = deadline or time.monotonic() + OUTCOME_RETRY_S
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(delay)
            delay = min(delay * 2, PUBLISH_RETRY_MAX_S)
        except LeaseNotHeld:
            raise
        except Exception as exc:
            return refusal(exc, extra)
    return ErrorCode.UNAVAILABLE, "the shared backend is unavailable; retry shortly"


async def publish_retrying(log: EventLog, events: tuple[Any, ...], retry_s: float,
                           extra: Mapping[str, Any], checkpoint: DecisionCheckpoint | None = None
                           ) -> None:
    """Log a committed decision's events (with its checkpoint), retrying a backend
    outage for `retry_s`. Every attempt is the same write (`one_write`): an attempt
    whose reply was lost, yet logged, is not logged again (a second `run.finished`)."""
    deadline = time.monotonic() + retry_s
    delay = 0.05
    with one_write(log.remote):
        while True:
            try:
                await log.publish_many(events, checkpoint)
                return
            except UnloggableEvent as exc:
                raise unloggable(exc, extra) from exc
            except BackendUnavailable as exc:
                if time.monotonic() > deadline:
                    raise PublishFailed(new_ref(), "backend unavailable", exc) from exc
                await asyncio.sleep(delay)
                delay = min(delay * 2, PUBLISH_RETRY_MAX_S)
