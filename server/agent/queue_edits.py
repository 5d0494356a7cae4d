"""What the edits made while a run waited in the queue mean for it, pure.

A queued run's `run.start` carried the document (its version, its scope) as it was
when the run was accepted; by the time the run's turn comes, people and other runs
may have changed it. At its start the run is judged by every `document.changed`
logged while it waited, by the rules that hold while it runs (PROTOCOL section 11):
a person's edit ends it under `on_edit: abort`, or under `overlap` when the edit
touches its scope (or says no ranges); other edits move its scope, and the model's
first request says what changed. Another run's edits (origin `agent`) never end it:
they move and resize its scope as the run's own would. Before, the run started
with the stale version and scope: an edit in its real text went through and one
outside it ended the run.
"""

from typing import Any

from server.agent.edits import Edit, edit_note, judge_edit, with_note
from server.agent.run_state import RunState

WAITED = "while this run waited in the queue"
UNKNOWN = edit_note("someone", None, f"maybe, {WAITED} (too much happened to tell)", None)


def _changes(event: dict[str, Any]) -> tuple[Edit, ...] | None:
    listed = event.get("changes")
    if not isinstance(listed, list):
        return None
    return tuple((int(c["from"]), int(c["to"]), int(c["insert"])) for c in listed)


def judge_waited(state: RunState, changed: list[dict[str, Any]] | None) -> RunState | None:
    """`state` after the `document.changed` events (decoded) logged while it waited, or
    None when one of them ends it. `changed` None: the log no longer holds them all
    (the runs before it logged more than the log keeps, or Redis lost it): nothing is
    known, so nothing ends it, and the model is told the document may have changed."""
    if changed is None:
        return state.evolve(edits=with_note(state.edits, UNKNOWN))
    for event in changed:
        user, version = str(event.get("user_id")), event.get("document_version")
        changes = _changes(event)
        if event.get("origin") == "agent":
            moved = judge_edit(state, user, "agent", version, None, changes).state
            note = edit_note(user, version, f"another run's edit, {WAITED}", changes)
            state = moved.evolve(edits=with_note(moved.edits, note))
            continue
        verdict = judge_edit(state, user, "user", version, WAITED, changes)
        if verdict.abort:
            return None
        state = verdict.state
    return state

