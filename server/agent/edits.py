"""What a human edit means for a run (PROTOCOL.md section 11), pure.

`on_edit: abort` (the default): any user edit ends the run. `overlap`: only an
edit that touches the run's scope does; others move the scope (logged as
`run.scope`). `continue`: none does. In the last two modes the model's next
request says what changed since its previous one, so it can re-read the
document before editing it. An `editor.change` without `changes` touches
everything (section 11); one with an empty list, or with no-op changes only,
touches nothing, whether the run has a scope or works on the whole document.
The run's own edits (origin `agent`) never end it: they move the scope and
resize a range they touch (`scope.grow`), logged as `run.scope` too; one that
would push a range past `scope.MAX_OFFSET` makes the scope the whole document
(no `run.scope`: that event cannot say "the whole document").
"""

import hashlib
from dataclasses import dataclass
from typing import Any

import orjson

from server.agent import scope as ranges
from server.agent.run_state import RunState

STALE = "the document changed since this call was made; read it again before editing"
Span = tuple[int, int]
Edit = tuple[int, int, int]  # from, to, insert


@dataclass(frozen=True, slots=True)
class EditVerdict:
    abort: bool
    state: RunState
    moved: tuple[Span, ...] | None = None  # overlap mode: the scope after the edit


def _apply(scope: tuple[Span, ...], changes: tuple[Edit, ...]) -> tuple[Span, ...] | None:
    moved = ranges.apply([ranges.Range(a, b) for a, b in scope],
                         [ranges.Change(f, t, i) for f, t, i in changes])
    return None if moved is None else tuple((r.from_, r.to) for r in moved)


def _follow(scope: tuple[Span, ...], changes: tuple[Edit, ...]) -> tuple[Span, ...] | None:
    followed = ranges.follow([ranges.Range(a, b) for a, b in scope],
                             [ranges.Change(f, t, i) for f, t, i in changes])
    return None if followed is None else tuple((r.from_, r.to) for r in followed)


def judge_edit(state: RunState, user_id: str, origin: str, version: Any, summary: str | None,
               changes: tuple[Edit, ...] | None) -> EditVerdict:
    """The run's answer to one `editor.change`."""
    known = version if version is not None else state.document_version
    if origin == "agent":  # the run's own edits never end it; they move and resize its scope
        if not changes or not state.scope:
            return EditVerdict(False, state.evolve(document_version=known))
        followed = _follow(state.scope, changes)  # None: the whole document from now on
        return EditVerdict(False, state.evolve(document_version=known, scope=followed),
                           followed if followed not in (None, state.scope) else None)
    if state.on_edit == "abort":
        return EditVerdict(True, state)
    scope, moved = state.scope, None
    if state.on_edit == "overlap":
        if changes is None:  # no ranges given: section 11 says it overlaps everything
            return EditVerdict(True, state)
        if scope is None:  # the whole document: any change that changed a unit overlaps it;
            if any(f != t or i for f, t, i in changes):  # an empty list or no-ops do not
                return EditVerdict(True, state)  # (scope.edit_overlaps, edits.js agree)
        else:
            after = _apply(scope, changes)
            if after is None:
                return EditVerdict(True, state)
            scope = moved = after  # logged even when unmoved: the scope at the new version
    note = edit_note(user_id, version, summary, changes)
    return EditVerdict(False, state.evolve(document_version=known, scope=scope,
                                      edits=with_note(state.edits, note)), moved)


EDIT_KEYS_KEPT = 4
"""Keys of the last edits a run applied (`RunState.edit_keys`), this many per sender (a
user's client): a client sends an edit again, under the same `id`, after it was refused
`unavailable` (its `document.changed` could not be logged, or the run's owner not found),
and holds its later edits until then (static/client.js: one `editor.change` in flight), so
a resend comes while its key is among its sender's last few; other clients' edits cannot
push it out."""
EDIT_SENDERS_KEPT = 64
"""Senders whose keys a run keeps: the one heard from longest ago goes first."""


def _hash(value: Any, size: int) -> str:
    return hashlib.blake2b(orjson.dumps(value, option=orjson.OPT_SORT_KEYS),
                           digest_size=size).hexdigest()


def edit_key(client_id: str, message: dict[str, Any]) -> str | None:
    """What names one `editor.change` (`message`, its wire form) for the run and the
    log: its sender and `id` (None without one: it cannot be sent again as itself), and
    its content, so an `id` a client used again for another edit is another edit. It is
    `<client>.<edit>` (`sender_key` adds the user: `client_id` is the client's choice)."""
    if message.get("id") is None:
        return None
    return f"{_hash(client_id, 6)}.{_hash([client_id, message], 12)}"


def sender_key(user_id: str, key: str) -> str:
    """`key` (`edit_key`) with its sender made of the user and the client."""
    client, _, edit = key.rpartition(".")
    return f"{_hash([user_id, client], 6)}.{edit}"


def with_key(keys: tuple[str, ...], key: str) -> tuple[str, ...]:
    """`keys` and `key` (`sender_key`): the newest EDIT_KEYS_KEPT of each sender's, of the
    EDIT_SENDERS_KEPT senders heard from last; in the order they came."""
    sender = key.partition(".")[0]
    mine = [k for k in keys if k.partition(".")[0] == sender]
    drop = set(mine[:len(mine) + 1 - EDIT_KEYS_KEPT]) if len(mine) >= EDIT_KEYS_KEPT else set()
    kept = [k for k in keys if k not in drop]
    last: dict[str, int] = {}
    for i, k in enumerate([*kept, key]):
        last[k.partition(".")[0]] = i
    senders = set(sorted(last, key=last.__getitem__)[-EDIT_SENDERS_KEPT:])
    return tuple(k for k in (*kept, key) if k.partition(".")[0] in senders)


def later_version(known: int | str | None, reported: int | str) -> int | str:
    """The document version after a client tool ran, as its `tool.result` reports it:
    the next `tool.call` carries it (a client refusing calls made on an older version
    would otherwise refuse every call after an editing tool). Integer versions never
    move back (a person's later edit may have been reported first); other versions
    are opaque, and the latest report wins, as with `editor.change`."""
    if isinstance(known, int) and isinstance(reported, int) and reported < known:
        return known
    return reported


NOTES_KEPT = 20
"""Edit notes the run keeps for the model's next request: the newest, after one that
counts the rest. A person typing through a long wait (an approval) made thousands,
every one checkpointed whole with all the notes before it (2 MB of Redis writes for
200 edits, growing with their square), and all of them went into the prompt."""


def with_note(edits: tuple[dict[str, Any], ...], note: dict[str, Any]
              ) -> tuple[dict[str, Any], ...]:
    """`edits` and `note`, at most NOTES_KEPT of them: the oldest folded into a count
    (`{"earlier": n}`, always first)."""
    if len(edits) < NOTES_KEPT:
        return (*edits, note)
    counted = edits[0]["earlier"] + 1 if "earlier" in edits[0] else 2
    return ({"earlier": counted}, *edits[2:], note)


def edit_note(user_id: str, version: Any, summary: str | None,
              changes: tuple[Edit, ...] | None) -> dict[str, Any]:
    """One edit as the model will be told of it (`changes_note`)."""
    return {"user_id": user_id, "document_version": version, "summary": summary,
            "changes": [list(c) for c in changes] if changes is not None else None}


def changes_note(edits: tuple[dict[str, Any], ...]) -> str:
    """What the model is told before its next request about edits made meanwhile."""
    lines = ["While you worked, people edited the document:"]
    for edit in edits:
        if "earlier" in edit:
            lines.append(f"- {edit['earlier']} earlier edits (not listed)")
            continue
        where = ("somewhere (no ranges given)" if edit["changes"] is None else
                 ", ".join(f"[{f}, {t}) replaced by {i} units" for f, t, i in edit["changes"])
                 or "nothing (an empty list of changes)")
        summary = f": {edit['summary']}" if edit.get("summary") else ""
        lines.append(f"- {edit['user_id']} (document version {edit['document_version']})"
                     f"{summary}; changed {where}")
    lines.append("Read the document again before you edit it.")
    return "\n".join(lines)
