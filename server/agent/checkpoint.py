"""A run's state as JSON, and back: what the owner shares so another instance can take
the run over (PROTOCOL.md section 13). The machine's own state is what is saved;
there is no second, durable copy to keep in step."""

from dataclasses import fields, replace
from typing import Any

from protocol.client import RunContext, ToolSpec
from protocol.server import RunError
from server.agent.grown import as_json
from server.agent.run_state import Ending, ModelCall, PendingCall, RunState

_SETS = ("tool_allowlist", "approval_tools", "call_ids", "completed_calls", "approved_names")


def to_checkpoint(state: RunState) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for field in fields(state):
        value = as_json(getattr(state, field.name))  # a Grown as a list, a GrownSet sorted
        if field.name in _SETS:
            value = None if value is None else sorted(value)
        elif field.name == "context":
            value = None if value is None else value.to_wire()
        elif field.name == "client_tools":
            value = [tool.to_wire() for tool in value]
        elif field.name == "queue":
            value = [_slots(call) for call in value]
        elif field.name in ("current", "ending"):
            value = None if value is None else _slots(value)
            if field.name == "ending" and value is not None and value["error"] is not None:
                value["error"] = value["error"].to_wire()
        elif isinstance(value, (tuple, list)):
            value = [list(item) if isinstance(item, tuple) else item for item in value]
        data[field.name] = value
    return data


def _slots(value: Any) -> dict[str, Any]:
    return {name: getattr(value, name) for name in value.__slots__}


def from_checkpoint(data: dict[str, Any]) -> RunState:
    values = dict(data)
    for name in _SETS:
        values[name] = None if values.get(name) is None else frozenset(values[name])
    values["context"] = None if values.get("context") is None else \
        RunContext.model_validate(values["context"])
    values["client_tools"] = tuple(ToolSpec.model_validate(t) for t in values["client_tools"])
    values["queue"] = tuple(ModelCall(**call) for call in values["queue"])
    values["current"] = None if values.get("current") is None else \
        PendingCall(**values["current"])
    if values.get("ending") is not None:
        ending = dict(values["ending"])
        ending["error"] = None if ending["error"] is None else \
            RunError.model_validate(ending["error"])
        values["ending"] = Ending(**ending)
    for name in ("scope", "usage"):
        if values.get(name) is not None:
            values[name] = tuple(tuple(item) for item in values[name])
    for name in ("edits", "edit_keys", "messages", "tool_results"):
        values[name] = tuple(values.get(name) or ())
    known = {f.name for f in fields(RunState)}
    return replace(RunState(**{k: v for k, v in values.items() if k in known}))
