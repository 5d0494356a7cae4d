"""Claiming a document for a run that starts (`RunCoordinator._start`), through the runs
that still hold it: one that has ended (its owner frees it right after logging its
`run.finished`), one being interrupted, or the same client's run on another instance
(superseded there)."""

import asyncio
from typing import Any

from server.agent.environment import RunEnvironment
from server.agent.run_state import TERMINAL, RunState
from server.backends.base import RunRegistry
from server.connection import Peer

SUPERSEDE_WAIT_S = 3.0
RELEASE_WAIT_S = 1.0
_POLL_S = 0.02


async def claim_document(env: RunEnvironment, document_id: str, state: RunState, peer: Peer,
                         interrupting: bool = False) -> dict[str, Any] | None:
    """Hold the document for `state`; the holder's record if someone else does."""
    registry, lease = env.registry, env.settings.run_lease_s
    record = state.to_record(env.instance_id)
    holder = await registry.claim_run(document_id, record, lease)
    if holder is not None and (interrupting or await run_ending(registry, document_id, holder)):
        # its run.finished is logged (or the interrupt is on its way): the release follows.
        # A run being handed over (SIGTERM) is interrupted by its next owner, once it has
        # taken it over (a janitor tick) and replayed what the last one left: waited for
        # (the sender was told `document_busy`, and the run was interrupted after all).
        loop = asyncio.get_running_loop()
        deadline, extended = loop.time() + RELEASE_WAIT_S, False
        while holder is not None and (
                interrupting or await run_ending(registry, document_id, holder)):
            if interrupting and holder.get("handoff") and not extended:
                deadline, extended = loop.time() + lease + RELEASE_WAIT_S, True
            if loop.time() >= deadline:
                break
            await asyncio.sleep(_POLL_S)
            holder = await registry.claim_run(document_id, record, lease)
    if holder is None or holder.get("client_id") != peer.client_id or \
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


async def run_ending(registry: RunRegistry, document_id: str, holder: dict[str, Any]) -> bool:
    """Whether the run holding the document has already ended (its record says so)."""
    if holder.get("status") in TERMINAL:  # written with its `run.finished`
        return True
    record = await registry.get_run_record(document_id, str(holder.get("run_id")))
    return record is not None and record.get("status") in TERMINAL
