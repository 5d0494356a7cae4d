"""Redis backend (`COWRITE_REDIS_URL`): several instances, one document session.

Per document (keys share a hash tag, so a cluster keeps them on one slot):
- `cw:{doc}:meta` hash: `epoch`, `last_seq`;
- `cw:{doc}:log` stream: one entry per event, ID `<seq>-1`, trimmed with
  `MAXLEN ~` (which keeps at least the last N);
- `cw:{doc}:hist:t:<thread>` lists, `cw:{doc}:hist:threads` sorted set,
  `cw:{doc}:hist:meta` hash: conversation history, capped fairly across threads
  (redis_history.py; `cw:{doc}:hist`, the one list earlier versions read and
  write, is still written as they wrote it, and what they append there is taken
  in by the next append); `cw:{doc}:runs` hash: run records
  (the newest `RUN_RECORDS_MAX` by first write, kept in `cw:{doc}:run-order`);
- `cw:{doc}:writes` sorted set: the write ids of the last appends and their seqs,
  so an append tried again after its reply was lost is not logged twice.
The event is serialized in Python before the script runs, so an event that
cannot be encoded (`UnloggableEvent`) never takes a seq. One Lua script
stamps seq, writes the stream entry and publishes the frame on
`cw:live:{doc}` atomically, so pub/sub delivers in seq order; an instance that
misses a message (a reconnect) fills the gap from the stream. Limits and
presence are shared (redis_presence.py).

Every Redis failure surfaces as `BackendUnavailable`; the pub/sub reader
reconnects by itself and re-reads what it missed.
"""

import asyncio
import contextlib
import logging
import math
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar

import orjson
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from server.backends.base import (
    RUN_RECORDS_MAX,
    BackendUnavailable,
    EventListener,
    LoggedEvent,
    LogHead,
    LogReset,
    ResumeFailure,
    RunMovedOn,
    RunParts,
    encode_event_body,
)
from server.backends.memory_history import HISTORY_MAX_ENTRIES
from server.backends.redis_clock import RedisClock
from server.backends.redis_fanout import RedisFanOut, channel_of
from server.backends.redis_history import RedisHistory
from server.backends.redis_instances import RedisInstances
from server.backends.redis_presence import RedisPresence
from server.backends.redis_queue import RedisRunQueue
from server.backends.redis_scripts import (
    APPEND_LUA,
    CLAIM_RUN_LUA,
    CONNECTION_LUA,
    EXPIRED_RUNS_LUA,
    FENCED_APPEND_LUA,
    HAND_OFF_RUN_LUA,
    HEAD_LUA,
    PRESENT_LUA,
    PUT_RUN_RECORD_LUA,
    RELEASE_RUN_LUA,
    RENEW_AND_APPEND_LUA,
    RENEW_RUN_LUA,
    RUN_SLOT_LUA,
)

logger = logging.getLogger("cowrite.redis")
T = TypeVar("T")

RUN_RECORD_TTL_S = 86_400
READ_CHUNK = 1000
# Write ids remembered per document (APPEND_LUA): an append tried again after this many
# other events of its document were logged would be logged twice. A retry comes within
# seconds (`publish_retrying`, a held delta's next flush); 96 (+32 before a cut) keep the
# set a listpack (zset-max-listpack-entries 128): about 3 KB per document.
WRITE_IDS_KEPT = 96
WRITE_IDS_TTL_MS = 600_000

LEASES_KEY = "cw:leases"


def _keys(document_id: str) -> tuple[str, str]:
    return f"cw:{{{document_id}}}:meta", f"cw:{{{document_id}}}:log"


def _run_keys(document_id: str) -> list[str]:
    """The active run's record, the lease set, the lease holder and the checkpoint parts
    (see redis_scripts)."""
    return [f"cw:{{{document_id}}}:active", LEASES_KEY, f"cw:{{{document_id}}}:owner",
            f"cw:{{{document_id}}}:run-parts"]


def _url_problem(exc: ValueError) -> str:
    """redis-py's words for a URL it cannot parse, when they hold none of the URL (the
    scheme, a query parameter's name); urllib's about a port quote its text, which a
    misplaced password would be."""
    said = str(exc)
    if said.startswith(("Redis URL must specify", "Invalid value for")):
        return said
    return ("not a Redis URL: write redis://[[user]:password@]host[:port][/db], "
            "rediss://... or unix://path")


class RedisBackend(RedisFanOut, RedisRunQueue, RedisInstances, RedisPresence, RedisHistory):
    remote = True

    def __init__(self, url: str, log_max_events: int = 10_000, op_timeout_s: float = 2.0, *,
                 history_max_entries: int = HISTORY_MAX_ENTRIES) -> None:
        self._url = url
        try:
            self._redis = aioredis.Redis.from_url(
                url, decode_responses=True, socket_timeout=op_timeout_s,
                socket_connect_timeout=op_timeout_s, health_check_interval=10,
            )
        except ValueError as exc:  # the start's one line names the variable, not its value
            raise ValueError(f"COWRITE_REDIS_URL: {_url_problem(exc)}") from None
        self._log_max_events = log_max_events
        self._append = self._redis.register_script(APPEND_LUA)
        self._fenced_append = self._redis.register_script(FENCED_APPEND_LUA)
        self._head = self._redis.register_script(HEAD_LUA)
        self._run_slot = self._redis.register_script(RUN_SLOT_LUA)
        self._connection = self._redis.register_script(CONNECTION_LUA)
        self._claim_run = self._redis.register_script(CLAIM_RUN_LUA)
        self._renew_run = self._redis.register_script(RENEW_RUN_LUA)
        self._renew_and_append = self._redis.register_script(RENEW_AND_APPEND_LUA)
        self._release_run = self._redis.register_script(RELEASE_RUN_LUA)
        self._hand_off_run = self._redis.register_script(HAND_OFF_RUN_LUA)
        self._expired_runs = self._redis.register_script(EXPIRED_RUNS_LUA)
        self._present = self._redis.register_script(PRESENT_LUA)
        self._put_run_record = self._redis.register_script(PUT_RUN_RECORD_LUA)
        self._init_history(history_max_entries)
        self._presence: dict[str, tuple[str, str]] = {}  # member -> (document id, as stored)
        self._instance_id = ""  # this instance's, from its first heartbeat
        self._listeners: dict[str, list[EventListener]] = defaultdict(list)
        self._on_reset: dict[str, dict[EventListener, LogReset]] = {}
        self._last_seen: dict[str, tuple[str, int]] = {}
        self._subscribe_lock = asyncio.Lock()
        self._pubsub: Any = None
        self._tasks: list[asyncio.Task[None]] = []
        self._live_connections: dict[str, str] = {}  # connection id -> user id
        self._clock = RedisClock()  # what every score and "now" is stamped with
        self._failing = False  # the last call failed: Redis is out of reach
        self._back_at = -math.inf  # when a call worked again after failing (monotonic)
        self._renew_now = asyncio.Event()
        self.reconnects = 0

    # -- lifecycle ---------------------------------------------------------------
    async def start(self) -> None:
        with contextlib.suppress(RedisError, OSError):  # else at the first heartbeat
            await self._clock.sync(self._redis)
        self._tasks = [asyncio.create_task(self._pubsub_loop()),
                       asyncio.create_task(self._renew_loop())]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._retire_pubsub()  # a listener leaving later has nothing to unsubscribe
        await self._redis.aclose()

    async def ready(self) -> bool:
        try:
            return bool(await asyncio.wait_for(self._redis.ping(), 1.0))
        except (RedisError, OSError, TimeoutError):
            return False

    async def _call(self, awaitable: Awaitable[T]) -> T:
        try:
            result = await awaitable
        except (RedisError, OSError) as exc:
            self._failing = True
            raise BackendUnavailable(f"redis: {exc}") from exc
        if self._failing:  # Redis is back
            self._failing = False
            self._back_at = time.monotonic()
            self._renew_now.set()
        return result

    # -- the document log --------------------------------------------------------
    async def append(self, document_id: str, event: dict[str, Any], write_id: str = ""
                     ) -> LoggedEvent:
        # Serialized here, before the script takes a seq: UnloggableEvent leaves no gap.
        body = encode_event_body(event).decode()
        event_type = str(event["type"])
        epoch, seq, frame, *again = await self._call(self._append(
            keys=[*_keys(document_id), f"cw:{{{document_id}}}:writes"],
            args=[uuid.uuid4().hex, body, self._clock.now_ms(), self._log_max_events,
                  event_type, channel_of(document_id), write_id, WRITE_IDS_KEPT,
                  WRITE_IDS_TTL_MS],
        ))
        logged = LoggedEvent(int(seq), event_type, frame)
        if not again:  # else done by an attempt whose reply was lost: its frame came by pub/sub
            self._deliver(document_id, epoch, logged)
        return logged

    append_once = append  # `append` is idempotent per write id (APPEND_LUA)

    async def append_fenced(self, document_id: str, event: dict[str, Any], write_id: str
                            ) -> None:
        """`append_once` of an event of the run `event["run_id"]` only while this instance
        holds that run's lease, checked in the same step (FENCED_APPEND_LUA); else
        `RunMovedOn`, nothing logged. An id logged already is not logged again."""
        body = encode_event_body(event).decode()
        event_type, run_id = str(event["type"]), str(event["run_id"])
        result = await self._call(self._fenced_append(
            keys=[*_keys(document_id), f"cw:{{{document_id}}}:writes",
                  f"cw:{{{document_id}}}:active", f"cw:{{{document_id}}}:owner"],
            args=[uuid.uuid4().hex, body, self._clock.now_ms(), self._log_max_events,
                  event_type, channel_of(document_id), write_id, WRITE_IDS_KEPT,
                  WRITE_IDS_TTL_MS, run_id, self._instance_id]))
        if not result:
            raise RunMovedOn(run_id)
        epoch, seq, frame, *again = result
        if not again:
            self._deliver(document_id, epoch, LoggedEvent(int(seq), event_type, frame))

    async def head(self, document_id: str) -> LogHead:
        epoch, last = await self._call(self._head(keys=_keys(document_id),
                                                  args=[uuid.uuid4().hex]))
        return LogHead(epoch, int(last))

    async def read_after(
        self, document_id: str, epoch: str, after_seq: int, until_seq: int | None = None
    ) -> list[LoggedEvent] | ResumeFailure:
        head = await self.head(document_id)
        if epoch != head.epoch:
            return "epoch_changed"
        if after_seq > head.last_seq:
            return "history_truncated"
        last = head.last_seq if until_seq is None else min(until_seq, head.last_seq)
        events: list[LoggedEvent] = []
        start = after_seq + 1
        while start <= last:
            # decode_responses=True: ids and fields are str, which the stubs cannot know
            entries: Any = await self._call(self._redis.xrange(
                _keys(document_id)[1], f"{start}-0", f"{last}-1", count=READ_CHUNK))
            if not entries:
                break
            for entry_id, fields in entries:
                events.append(LoggedEvent(int(entry_id.split("-")[0]), fields["t"], fields["f"]))
            start = events[-1].seq + 1
        if after_seq < last and (not events or events[0].seq != after_seq + 1
                                 or len(events) != last - after_seq):
            return "history_truncated"  # entries are found by seq (stream ID); none may miss
        return events

    # -- run records (history: RedisHistory) ------------------------------------
    async def put_run_record(self, document_id: str, run_id: str, record: dict[str, Any]) -> None:
        await self._call(self._put_run_record(
            keys=[f"cw:{{{document_id}}}:runs", f"cw:{{{document_id}}}:run-order"],
            args=[run_id, orjson.dumps(record).decode(), RUN_RECORD_TTL_S, self._clock.now_ms(),
                  RUN_RECORDS_MAX]))

    async def get_run_record(self, document_id: str, run_id: str) -> dict[str, Any] | None:
        raw = await self._call(self._redis.hget(f"cw:{{{document_id}}}:runs", run_id))
        return None if raw is None else dict(orjson.loads(raw))

    async def claim_once(self, key: str, ttl_s: float) -> bool:
        claimed = await self._call(self._redis.set(f"cw:once:{key}", "1", nx=True,
                                                   px=int(ttl_s * 1000)))
        return bool(claimed)

    # -- run ownership across instances ---------------------------------------
    async def claim_run(self, document_id: str, record: dict[str, Any], lease_s: float
                        ) -> dict[str, Any] | None:
        active = await self._call(self._claim_run(
            keys=_run_keys(document_id),
            args=[orjson.dumps(record).decode(), self._clock.now_ms() + int(lease_s * 1000),
                  document_id, record["owner"]]))
        return None if not active else dict(orjson.loads(active))

    async def renew_run(self, document_id: str, record: dict[str, Any], lease_s: float,
                        parts: RunParts | None = None) -> bool:
        """The record, and the checkpoint parts it counts, in one step (`RENEW_RUN_LUA`)."""
        args = [orjson.dumps(record).decode(), self._clock.now_ms() + int(lease_s * 1000),
                document_id, record["run_id"], record["owner"],
                "1" if parts and parts.reset else "0"]
        renewed = await self._call(self._renew_run(
            keys=_run_keys(document_id), args=[*args, *(parts.entries if parts else ())]))
        return bool(renewed)

    async def renew_and_append(self, document_id: str, record: dict[str, Any], lease_s: float,
                               parts: RunParts | None, events: Sequence[dict[str, Any]]
                               ) -> bool:
        bodies: list[str] = []
        for event in events:  # every event encoded before anything is written
            bodies += [encode_event_body(event).decode(), str(event["type"])]
        entries = parts.entries if parts else ()
        now = self._clock.now_ms()
        result = await self._call(self._renew_and_append(
            keys=[*_run_keys(document_id), *_keys(document_id),
                  f"cw:{{{document_id}}}:writes"],
            args=[orjson.dumps(record).decode(), now + int(lease_s * 1000), document_id,
                  record["run_id"], record["owner"], "1" if parts and parts.reset else "0",
                  str(record.get("write", "")), len(entries), *entries, uuid.uuid4().hex, now,
                  self._log_max_events, channel_of(document_id), WRITE_IDS_KEPT,
                  WRITE_IDS_TTL_MS, *bodies]))
        if not result:
            return False
        if result == 1:  # done by an attempt whose reply was lost: its frames came by pub/sub
            return True
        epoch = result[0]
        for index, event in enumerate(events):
            seq = int(result[1 + 2 * index])
            if seq:  # else logged before under its write id: its frame came by pub/sub
                self._deliver(document_id, epoch, LoggedEvent(
                    seq, str(event["type"]), result[2 + 2 * index]))
        return True

    async def run_parts(self, document_id: str) -> list[str]:
        raw = await self._call(self._redis.lrange(_run_keys(document_id)[3], 0, -1))
        return [item.decode() if isinstance(item, bytes) else str(item) for item in raw]

    async def hand_off_run(self, document_id: str, record: dict[str, Any]) -> bool:
        handed = await self._call(self._hand_off_run(
            keys=_run_keys(document_id),
            args=[orjson.dumps(record).decode(), document_id, record["run_id"],
                  record["owner"]]))
        return bool(handed)

    async def release_run(self, document_id: str, run_id: str, owner: str) -> None:
        await self._call(self._release_run(keys=_run_keys(document_id),
                                           args=[run_id, document_id, owner]))

    async def active_run(self, document_id: str) -> dict[str, Any] | None:
        raw = await self._call(self._redis.get(f"cw:{{{document_id}}}:active"))
        return None if raw is None else dict(orjson.loads(raw))

    async def expired_runs(self, claimer: str, lease_s: float = 10.0
                           ) -> list[tuple[str, dict[str, Any]]]:
        now = self._clock.now_ms()
        flat = await self._call(self._expired_runs(
            keys=[LEASES_KEY], args=[now, now + int(lease_s * 1000), claimer]))
        return [(flat[i], dict(orjson.loads(flat[i + 1]))) for i in range(0, len(flat), 2)]
