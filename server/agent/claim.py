"""Claiming a document for a run that starts (`RunCoordinator._start`), through the runs
that still hold it: one that has ended (its owner frees it right after logging its
`run.finished`), one being interrupted, or the same client's run on another instance
(superseded there). And the answer to a start whose document stays held.

A run that has ended but still holds the document is a passing state: its owner could
not free it (Redis away as it tried, for half a lease; then its lease lapses and a
janitor frees it). Held by this instance, the start frees it, as that janitor would
(the release is fenced: it frees nothing another instance holds now). Held by another,
the start is refused `unavailable` with `retry_after_ms`, which clients send again. It
was `document_busy` "of another client", which means another run is active and which
clients do not retry: the tab whose own run had ended waited for ever (chaos soak)."""

import asyncio
import contextlib
from typing import Any

from protocol.codes import ErrorCode
from server.agent.driver import RunDriver
from server.agent.environment import RunEnvironment
from server.agent.run_state import TERMINAL, RunState
from server.agent.takeover import let_go_if_ended
from server.backends.base import RunRegistry
from server.connection import Peer

SUPERSEDE_WAIT_S = 3.0
RELEASE_WAIT_S = 1.0
RETRY_AFTER_MS = 1000  # a start refused while an ended run's claim is freed
_POLL_S = 0.02


async def unless_ended(driver: RunDriver | None) -> RunDriver | None:
    """This instance's run of the document unless it has ended: one letting go (its
    release follows its `run.finished`) is waited for a moment; still holding the
    document after that, its claim is `claim_document`'s to free (it was taken for
    an active run: a start of another client was told `document_busy`)."""
    if driver is None or not driver.state.finished:
        return driver
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(RELEASE_WAIT_S):
            await driver.done.wait()
    return None


async def claim_document(env: RunEnvironment, document_id: str, state: RunState, peer: Peer,
                         interrupting: bool = False) -> dict[str, Any] | None:
    """Hold the document for `state`; the holder's record if someone else does."""
    registry, lease = env.registry, env.settings.run_lease_s
    record = state.to_record(env.instance_id)
    holder = await registry.claim_run(document_id, record, lease)
    ended = holder is not None and await run_ending(registry, document_id, holder)
    if holder is not None and (interrupting or ended):
        # its run.finished is logged (or the interrupt is on its way): the release follows.
        # A run being handed over (SIGTERM) is interrupted by its next owner, once it has
        # taken it over (a janitor tick) and replayed what the last one left: waited for
        # (the sender was told `document_busy`, and the run was interrupted after all).
        loop = asyncio.get_running_loop()
        deadline, extended, freed = loop.time() + RELEASE_WAIT_S, False, False
        while holder is not None and (interrupting or ended):
            if ended and not freed and holder.get("owner") == env.instance_id:
                freed = True  # this instance's driver gave up freeing it: done here
                await let_go_if_ended(registry, env.instance_id, document_id, holder)
            elif interrupting and holder.get("handoff") and not extended:
                deadline, extended = loop.time() + lease + RELEASE_WAIT_S, True
            elif loop.time() >= deadline:
                break
            else:
                await asyncio.sleep(_POLL_S)
            holder = await registry.claim_run(document_id, record, lease)
            ended = holder is not None and await run_ending(registry, document_id, holder)
    if holder is None or ended or holder.get("client_id") != peer.client_id or \
            holder.get("user_id") != peer.user_id or holder.get("owner") == env.instance_id \
            or holder.get("run_id") == state.run_id:  # this very run: its start sent again
        return holder
    # The same client's run on another instance: supersede it there and wait.
    env.cluster.post(str(holder["owner"]), {
        "kind": "supersede", "document_id": document_id, "run_id": holder["run_id"]})
    try:
        async with asyncio.timeout(SUPERSEDE_WAIT_S):
            while holder is not None:
                await asyncio.sleep(0.05)
                holder = await registry.claim_run(document_id, record, lease)
    except TimeoutError:
        pass
    return holder


async def refuse_held(env: RunEnvironment, document_id: str, holder: dict[str, Any],
                      peer: Peer, reply_to: str | None) -> None:
    """Answer a `run.start` whose document `holder` still holds. `document_busy` only
    while another client's run is active (it is not retried); a run that has ended and
    is not freed yet, or the sender's own run not superseded in time, passes:
    `unavailable`, to be sent again after `retry_after_ms`."""
    run_id = holder.get("run_id")
    own = holder.get("client_id") == peer.client_id and holder.get("user_id") == peer.user_id
    whose = "this client's" if own else "the"
    if await run_ending(env.registry, document_id, holder):
        peer.error(ErrorCode.UNAVAILABLE, f"{whose} run {run_id!r} has ended; the document "
                   "is being freed: retry shortly", reply_to=reply_to,
                   retry_after_ms=RETRY_AFTER_MS)
    elif own:
        peer.error(ErrorCode.UNAVAILABLE, f"this client's run {run_id!r} has not ended yet "
                   "(a start supersedes it): retry shortly", reply_to=reply_to,
                   retry_after_ms=RETRY_AFTER_MS)
    else:
        peer.error(ErrorCode.DOCUMENT_BUSY, f"run {run_id!r} of another client is active "
                   "on this document", reply_to=reply_to, run_id=run_id)


async def run_ending(registry: RunRegistry, document_id: str, holder: dict[str, Any]) -> bool:
    """Whether the run holding the document has already ended (its record says so)."""
    if holder.get("status") in TERMINAL:  # written with its `run.finished`
        return True
    record = await registry.get_run_record(document_id, str(holder.get("run_id")))
    return record is not None and record.get("status") in TERMINAL
