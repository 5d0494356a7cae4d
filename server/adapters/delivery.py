"""What a frontend was given, so that no answer is lost when its link drops.

The adapters stream a run to the frontend in segments (chat_run.py). A segment
can fail to arrive although the run went on: the frontend's answer was applied
by the run, but the request carrying it was answered `503` (the adapter's link
to the document was closed by a drain or a log reset while the answer
travelled), or the stream broke off, or the run ended while nobody followed it.
The frontend then retries the answer, or reconnects, possibly through another
instance, possibly after the run has ended.

Each instance marks, in the shared backend, what a request streamed to its end
(`mark`): the segment that followed an answer (`answer_key`) and the run's end
(`end_key`). A retried answer that the run already applied is streamed its
segment once more if that segment was never delivered (else it stays a 409
`call_not_pending`, as a repeat always was), and a reconnect whose chat has no
active run replays the chat's last run once if its end was never delivered
(else 204). `claim_once` is the backend's only shared mark, so checking claims:
a retry or replay that breaks off again is not offered a third time.

Both hold for `WINDOW_S` after the answer or the run's end: the run is found in
the document log (`newest_ended_run`), which keeps the last
`COWRITE_LOG_MAX_EVENTS` events, so an older run may no longer be there.
"""

import contextlib
import hmac
import time

import orjson

from protocol.client import ToolResult
from server.adapters.adoption import run_events
from server.backends.base import Backend, BackendUnavailable

WINDOW_S = 300.0
"""How long after a run's end (or an answer) a lost segment is still delivered."""
MARK_TTL_S = 2 * WINDOW_S
"""How long the delivery marks are kept: longer than anything they decide."""
FIRST_WINDOWS = (256,)
"""The log's tail read for a recently ended run: one window. Reading on to the whole
log (10,000 events) cost a Redis reconnect 0.5 s and blocked the event loop, on every
page load of a chat with no active run, by any reader of the document."""
RECORDS_CHECKED = 8
"""Ended runs whose record is read when the log no longer holds their start."""


def answer_key(document_id: str, run_id: str, kind: str, call_id: str) -> str:
    return f"adapter-delivered:{document_id}:{run_id}:{kind}:{call_id}"


def end_key(document_id: str, run_id: str) -> str:
    return f"adapter-delivered:{document_id}:{run_id}:end"


async def mark(backend: Backend, key: str) -> bool:
    """Claim `key`: True if nothing claimed it before. Unreachable, the backend says
    False: nothing is streamed again that may have been delivered."""
    with contextlib.suppress(BackendUnavailable):
        return await backend.claim_once(key, MARK_TTL_S)
    return False


def recent(ts: int | None) -> bool:
    """An event stamped `ts` (ms since the epoch) happened within `WINDOW_S`."""
    return ts is not None and ts >= time.time() * 1000 - WINDOW_S * 1000


async def newest_ended_run(backend: Backend, document_id: str, client_id: str,
                           user_id: str, log_max_events: int) -> str | None:
    """The run id of the newest run of `client_id` and `user_id` when it ended within
    `WINDOW_S`, read from the log's tail (newest first, its last `FIRST_WINDOWS` events:
    a run followed by more events than that is not found). None when that run is still
    active, ended earlier, or is not in the log. A document runs one run at a time, so
    once a `run.finished` older than the window is read, every run before it ended
    earlier too; and once the events read are older than the window, a run that ended
    within it but started before is found by its run record (so is one whose start the
    log no longer holds)."""
    head = await backend.head(document_id)
    finished: list[str] = []  # ended within the window, newest first
    until = head.last_seq
    for size in sorted({min(n, log_max_events) for n in FIRST_WINDOWS}):
        after = max(0, head.last_seq - size)
        if after >= until:
            continue
        events = await backend.read_after(document_id, head.epoch, after, until)
        if not isinstance(events, list):  # the log no longer holds them
            break
        for logged in reversed(events):
            if logged.type not in ("run.started", "run.finished"):
                continue
            data = orjson.loads(logged.frame)
            run_id = str(data.get("run_id"))
            if logged.type == "run.finished":
                if not recent(data.get("ts")):
                    return await _by_record(backend, document_id, finished, client_id, user_id)
                finished.append(run_id)
            elif data.get("client_id") == client_id and data.get("user_id") == user_id:
                return run_id if run_id in finished else None
        until = after
        if after == 0 or not events or not recent(orjson.loads(events[0].frame).get("ts")):
            break  # older events ended earlier; a start they hold, the record has too
    return await _by_record(backend, document_id, finished, client_id, user_id)


async def _by_record(backend: Backend, document_id: str, finished: list[str],
                     client_id: str, user_id: str) -> str | None:
    """The newest of `finished` that was `client_id`'s and `user_id`'s, by its run
    record: the log no longer holds its start (a log reset, a long run)."""
    for run_id in finished[:RECORDS_CHECKED]:
        record = await backend.get_run_record(document_id, run_id)
        if record is not None and record.get("client_id") == client_id \
                and record.get("user_id") == user_id:
            return run_id
    return None


async def applied_result(backend: Backend, document_id: str, result: ToolResult, user_id: str,
                         log_max_events: int) -> bool:
    """Whether the run of `result`, ended within `WINDOW_S`, applied this very result:
    its `tool.call` carried this token (issued to `user_id`, the run's user) and its
    `tool.done` this output or error. The engine answers such a repeat `duplicate`
    while the run is active and `run_not_active` once it ended; the tool-results
    endpoint answers it `duplicate` then too (its first request may have been answered
    `unavailable` although the run applied it: a drain, a log reset)."""
    _, _, events = await run_events(backend, document_id, result.run_id, log_max_events)
    issued, done, ended, user = None, None, False, None
    for logged in events:
        if logged.type not in ("run.started", "tool.call", "tool.done", "run.finished"):
            continue
        data = orjson.loads(logged.frame)
        if data.get("run_id") != result.run_id:
            continue
        if logged.type == "run.started":
            user = data.get("user_id")
        elif logged.type == "run.finished":
            ended = recent(data.get("ts"))
        elif data.get("call_id") == result.call_id:
            issued, done = (data.get("token"), done) if logged.type == "tool.call" \
                else (issued, data)
    if not ended or user != user_id or not isinstance(issued, str) or done is None \
            or not hmac.compare_digest(issued.encode(), result.token.encode()):
        return False
    if result.error is not None:
        return bool(done.get("status") == "error" and done.get("error") == result.error.to_wire())
    return bool(done.get("status") == "ok" and done.get("output") == result.output)


__all__ = ["WINDOW_S", "answer_key", "applied_result", "end_key", "mark", "newest_ended_run",
           "recent"]
