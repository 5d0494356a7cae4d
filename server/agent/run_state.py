"""The state of one run, as plain frozen values.

`RunMachine` (machine.py) turns a `RunState` and an input into a new
`RunState` and effects; nothing here awaits or mutates. Keeping the state
immutable is what makes a transition atomic with what it announces: the
driver keeps the old value until the transition's events are logged, and a
failed publish simply leaves the old state in force (the input can be
retried). Every field is JSON-friendly so the state can be written to a
shared store as the run's record (`to_record`).
"""

from collections.abc import Sequence, Set
from dataclasses import dataclass, fields, replace
from typing import Any, Literal

import orjson

from protocol.client import RunContext, ToolSpec
from protocol.server import FinishedStatus, PendingItem, RunError, RunSnapshot, RunStatus
from server.auth import CallGrant
from server.records import quick_init

Phase = Literal["new", "model", "tools", "finished"]
TERMINAL: frozenset[str] = frozenset({"completed", "cancelled", "aborted", "failed", "timed_out"})
# Status order for the "only moves forward" rule: active statuses are peers, terminal ones last.
STATUS_RANK = {"queued": 0, "running": 1, "waiting_tool": 1, "waiting_approval": 1,
               **{status: 2 for status in TERMINAL}}


@quick_init
@dataclass(frozen=True, slots=True)
class ToolOutcome:
    status: Literal["ok", "error", "rejected", "timeout", "cancelled"]
    output: Any = None
    error: dict[str, Any] | None = None

    def for_model(self) -> str:
        """What the model reads as the tool message (never raises)."""
        if self.status == "ok":
            body: Any = self.output
        elif self.status == "rejected":
            body = {"error": "rejected by the user", **(self.error or {})}
        else:
            body = {"error": self.error or {"message": self.status}}
        try:
            return orjson.dumps(body).decode()
        except (TypeError, ValueError):
            return '{"error": {"message": "the tool output could not be encoded"}}'


@quick_init
@dataclass(frozen=True, slots=True)
class ModelCall:
    """A tool call the model asked for, checked by the driver against the run's tools."""

    call_id: str
    name: str
    raw_arguments: str
    arguments: dict[str, Any] | None = None  # None when `problem` says why the call is invalid
    executor: Literal["client", "server"] = "client"
    requires_approval: bool = False
    problem: str | None = None


@quick_init
@dataclass(frozen=True, slots=True)
class PendingCall:
    """The one call a run waits on: an approval, a client tool or a server tool."""

    call_id: str
    name: str
    arguments: dict[str, Any]
    kind: Literal["tool", "approval"]
    executor: Literal["client", "server"]
    expires_at: int
    token: str | None = None

    def item(self, include_token: bool) -> PendingItem:
        return PendingItem(kind=self.kind, call_id=self.call_id, name=self.name,
                           arguments=self.arguments, expires_at=self.expires_at,
                           token=self.token if include_token else None)

    @property
    def timer(self) -> str:
        """Named per kind: an approved call's tool timer must not share the approval
        timer's name, or a fire of the approval timer queued while the approval was
        being committed would be taken for the new tool timer's (the call then timed
        out at once)."""
        return f"{'approval' if self.kind == 'approval' else 'call'}:{self.call_id}"


@dataclass(frozen=True, slots=True)
class Ending:
    status: FinishedStatus
    reason: str | None = None
    error: RunError | None = None

    @classmethod
    def crash(cls, ref: str) -> "Ending":
        """A failure the run cannot recover from: the client gets the ref, the log the rest."""
        return cls("failed", "internal_error",
                   RunError(code="internal", message=f"internal error (ref {ref})"))


@dataclass(frozen=True)
class RunState:
    run_id: str
    document_id: str
    mode: Literal["agent", "chat"]
    user_id: str
    client_id: str
    prompt: str
    model: str
    max_steps: int
    json_tools: bool = False  # COWRITE_TOOL_FORMAT=json: answers are parsed, not streamed
    context: RunContext | None = None
    client_tools: tuple[ToolSpec, ...] = ()
    thread_id: str = "main"
    workflow: str | None = None
    tool_allowlist: frozenset[str] | None = None  # a workflow's: applies to every kind of tool
    approval_tools: frozenset[str] = frozenset()  # a workflow's: these need approval
    on_edit: Literal["abort", "overlap", "continue"] = "abort"
    scope: tuple[tuple[int, int], ...] | None = None  # None: the whole document
    document_version: int | str | None = None  # the latest the server knows
    edits: tuple[dict[str, Any], ...] = ()  # user edits since the model's last request
    edit_keys: tuple[str, ...] = ()  # the last edits applied, per sender (`edits.with_key`)
    phase: Phase = "new"
    status: RunStatus = "running"
    step: int = 0
    message_id: str | None = None
    # The model's context so far. This and the three growing collections below are
    # `Grown`/`GrownSet` once the machine added to them (O(1) per addition, grown.py);
    # any tuple or frozenset of the same items is equal to them.
    messages: Sequence[dict[str, Any]] = ()
    queue: tuple[ModelCall, ...] = ()  # calls of the current turn not yet run
    terminate_after_tools: bool = False
    current: PendingCall | None = None
    call_ids: Set[str] = frozenset()  # every call id the run has used
    completed_calls: Set[str] = frozenset()  # client calls whose result was accepted
    approved_names: frozenset[str] = frozenset()
    tool_results: Sequence[dict[str, Any]] = ()
    parse_failures: int = 0
    usage: tuple[tuple[str, int], ...] = ()
    executor_present: bool = True
    ending: Ending | None = None
    started_ms: int = 0  # when run.started was logged (the run timeout counts from it)
    resumes: int = 0  # takeovers so far (a repeated model call gets a new message id)

    def evolve(self, **changes: Any) -> "RunState":
        """`dataclasses.replace` without its cost: a copy of the fields with `changes`.

        `replace` runs `__init__` with all forty-odd fields, and a transition calls
        it several times: it was half of the machine's time per tool round trip.
        Unknown names are refused as `replace` refuses them; the values are not
        checked by mypy here, so the machine's property tests carry that weight."""
        if not changes.keys() <= _FIELD_NAMES:
            raise TypeError(f"RunState has no field(s) {sorted(changes.keys() - _FIELD_NAMES)}")
        attributes = self.__dict__.copy()  # a copy of a whole dict is one memcpy
        attributes.update(changes)
        new = object.__new__(RunState)
        object.__setattr__(new, "__dict__", attributes)
        return new

    # -- derived views --------------------------------------------------------
    @property
    def finished(self) -> bool:
        return self.phase == "finished"

    @property
    def waiting_on_executor(self) -> bool:
        """The run cannot go on without its executor (a client call or an approval)."""
        current = self.current
        return current is not None and (current.kind == "approval" or current.executor == "client")

    def usage_dict(self) -> dict[str, int]:
        return dict(self.usage)

    def add_usage(self, usage: dict[str, int]) -> "RunState":
        return self.evolve(usage=summed_usage(self.usage, usage)) if usage else self

    def grant(self, call_id: str, user_id: str, expires_at: int) -> CallGrant:
        return CallGrant(self.run_id, call_id, user_id, self.document_id, expires_at)

    def snapshot(self, for_user: str | None) -> RunSnapshot:
        include_token = for_user == self.user_id
        pending = [self.current.item(include_token)] if self.waiting_on_executor and \
            self.current is not None else []
        return RunSnapshot(run_id=self.run_id, status=self.status, mode=self.mode,
                           user_id=self.user_id, client_id=self.client_id, step=self.step,
                           pending=pending)

    def to_record(self, owner: str) -> dict[str, Any]:
        """What other instances know of a live run: its snapshot and its owner."""
        return {**self.snapshot(self.user_id).to_wire(), "owner": owner}


_FIELD_NAMES = frozenset(field.name for field in fields(RunState))


def summed_usage(usage: tuple[tuple[str, int], ...], added: dict[str, int]
                 ) -> tuple[tuple[str, int], ...]:
    """The run's token counts with a model turn's `added` (its integers) counted in."""
    totals = dict(usage)
    for key, value in added.items():
        if isinstance(value, int):
            totals[key] = totals.get(key, 0) + value
    return tuple(sorted(totals.items()))


def orphan_state(document_id: str, record: dict[str, Any]) -> RunState:
    """A run known only by its shared record (its owner is gone): enough state for
    the machine to end it with the right `tool.done` and `run.finished`."""
    pending = [item for item in record.get("pending") or () if isinstance(item, dict)]
    current = None
    if pending:
        item = pending[0]
        current = PendingCall(str(item["call_id"]), str(item.get("name", "")),
                              dict(item.get("arguments") or {}),
                              "approval" if item.get("kind") == "approval" else "tool",
                              "client", int(item.get("expires_at", 0)), item.get("token"))
    status = str(record.get("status", "running"))
    return RunState(
        run_id=str(record["run_id"]), document_id=document_id,
        mode="chat" if record.get("mode") == "chat" else "agent",
        user_id=str(record.get("user_id", "")), client_id=str(record.get("client_id", "")),
        prompt="", model="", max_steps=0, phase="tools" if current else "model",
        status=status if status in STATUS_RANK and status not in TERMINAL else "running",  # type: ignore[arg-type]
        step=int(record.get("step", 0)), current=current)


def unique_call_ids(used: Set[str], calls: tuple[ModelCall, ...], step: int
                    ) -> tuple[ModelCall, ...]:
    """The model's call ids when usable; deterministic fresh ones when missing, too
    long or reused (a call id names one call for the whole run). A fresh id is itself
    checked: a model may have named a call `call_s2_0` already."""
    seen: set[str] = set()  # this turn's; `used` is not copied (it grows with the run)
    fixed = []
    for index, call in enumerate(calls):
        call_id = call.call_id
        if not call_id or len(call_id) > 64 or call_id in used or call_id in seen:
            call_id, again = f"call_s{step}_{index}", 0
            while call_id in used or call_id in seen:
                again += 1
                call_id = f"call_s{step}_{index}_{again}"
        seen.add(call_id)
        fixed.append(call if call_id == call.call_id else replace(call, call_id=call_id))
    return tuple(fixed)
