"""An edit the run survives (PROTOCOL.md section 11), as machine effects: its
`run.scope` and, for durable runs, a checkpoint of the state it left.

A person's edit outside the scope moves the scope, the run's own edit (origin
`agent`) moves and grows it, and either gives the run a new document version
and maybe a note for the model. Without a checkpoint that state was shared
only at the lease's next renewal: an owner killed in between left a survivor
(section 13) the scope from before the edit, so it judged the next edits
against the wrong ranges (one inside the real scope did not abort the run, one
outside it did) and its next `tool.call` carried the old version. With a
`run.scope` to log, the checkpoint is written with it in one atomic step (the
same single Redis call as the plain append it replaces); an edit that logs
nothing (mode `continue`, an agent edit that moves nothing) costs one small
write of the record (the checkpoint's parts list is unchanged by an edit).
"""

from protocol.server import RunScopeChanged, ScopeSpan
from server.agent.edits import EditVerdict
from server.agent.run_state import RunState
from server.agent.steps import CHECKPOINT, DocumentEdited, EffectList


def survived_edit(state: RunState, verdict: EditVerdict, event: DocumentEdited,
                  out: EffectList, checkpoint: bool) -> RunState:
    """The state after `event`, which did not end the run (`verdict`, `judge_edit`):
    its `run.scope` when the scope is logged, and a checkpoint (`checkpoint`: durable
    runs) when the edit changed what a survivor would go on from."""
    after = verdict.state
    if verdict.moved is not None:
        out.publish(RunScopeChanged(
            run_id=state.run_id, scope=[ScopeSpan(**{"from": a, "to": b})
                                        for a, b in verdict.moved],
            document_version=event.version, user_id=event.user_id))
    if checkpoint and (after.document_version != state.document_version or
                       after.scope != state.scope or after.edits is not state.edits):
        out.do(CHECKPOINT)
    return after
