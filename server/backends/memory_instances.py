"""The memory backend's side of the cluster link: one process, so no other instance
lives, no lease lapses, and the only inbox reader is this process itself."""

import asyncio
import itertools
from collections.abc import AsyncIterator
from typing import Any


class MemoryInstances:
    """Mixed into `MemoryBackend`, which provides `_active` (document -> run record)."""

    _active: dict[str, dict[str, Any]]

    def __init__(self) -> None:
        self._inboxes: dict[str, asyncio.Queue[tuple[str, dict[str, Any]]]] = {}
        self._entry_ids = itertools.count(1)

    async def heartbeat(self, instance_id: str, ttl_s: float) -> None:
        return None

    async def leave(self, instance_id: str) -> None:
        return None

    async def live_instances(self) -> list[str]:
        return []

    async def hand_off_run(self, document_id: str, record: dict[str, Any]) -> bool:
        return False  # nobody to hand it to

    async def stalled_queues(self, recheck_s: float) -> list[str]:
        return []  # one process: the one that ended a run starts the next

    async def expired_runs(self, claimer: str, lease_s: float = 10.0
                           ) -> list[tuple[str, dict[str, Any]]]:
        return []

    def _inbox(self, instance_id: str) -> "asyncio.Queue[tuple[str, dict[str, Any]]]":
        return self._inboxes.setdefault(instance_id, asyncio.Queue())

    async def send(self, instance_id: str, message: dict[str, Any]) -> None:
        self._inbox(instance_id).put_nowait((str(next(self._entry_ids)), message))

    async def send_to_run_owner(self, document_id: str, run_id: str, message: dict[str, Any],
                                not_to: str = "", park: bool = False) -> str | None:
        active = self._active.get(document_id)
        if active is None or active.get("run_id") != run_id:
            return None
        owner = str(active.get("owner") or "")
        if owner in ("", not_to):
            if not (park and not_to and owner == not_to):
                return ""
        await self.send(owner, message)
        return owner

    async def inbox(self, instance_id: str) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        queue = self._inbox(instance_id)
        while True:
            yield await queue.get()

    async def has_message(self, instance_id: str, entry_id: str) -> bool:
        return True  # until its one reader takes it

    async def take_message(self, instance_id: str, entry_id: str) -> bool:
        return True  # the queue hands each entry to its one reader

    async def unread_messages(self, instance_id: str) -> list[tuple[str, dict[str, Any]]]:
        return []
