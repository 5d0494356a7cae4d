"""A checkpoint in two pieces, so that writing one costs the same at step 300 as at step 1.

A run's state grows: every model turn and every tool result adds to `messages`
and `tool_results`, and the prompt, the context (the document, maybe) and the
tool specs are large from the start. Writing the whole state at every step
made a checkpoint O(run length): 41 KB at the first tool call of the benchmark
run, 139 KB at the 300th, with the tool round trip 5x slower than without
checkpoints. So the owner writes:

- the **record's checkpoint**: the state without those fields, plus how many
  messages and tool results it has (`parts`); small and rewritten every time;
- the **parts**: an append-only list of JSON entries, `["c", constants]` once,
  then `["m", message]` and `["r", tool_result]` as they are added. Only the
  entries a checkpoint adds are sent with it (the backend appends them in the
  same atomic step that writes the record).

`Written` is what the owner knows the list holds. When the state is not an
extension of what was written (a new owner, a rewritten history, a write whose
outcome is unknown) the list is reset and written whole, once.

Pure functions; the lease (`lease.py`) does the I/O.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from server.agent.checkpoint import from_checkpoint, to_checkpoint
from server.agent.run_state import RunState

CONSTANT = ("prompt", "context", "client_tools")
GROWING = ("messages", "tool_results")


@dataclass(frozen=True, slots=True)
class Written:
    """What the shared parts list holds: counts, and the last entries by identity (a
    state whose items at those places are other objects was not built on them)."""

    messages: int = 0
    tool_results: int = 0
    constant: bool = False
    last_message: object | None = None
    last_result: object | None = None


@dataclass(frozen=True, slots=True)
class CheckpointWrite:
    checkpoint: dict[str, Any]  # goes into the run's record
    entries: tuple[str, ...]  # JSON entries to append to the parts list
    reset: bool  # empty the list first
    written: Written  # what the list holds once this write succeeded


def _extends(state: RunState, written: Written) -> bool:
    def builds_on(items: Sequence[Any], count: int, last: object | None) -> bool:
        return count == 0 or (len(items) >= count and items[count - 1] is last)

    return written.constant and builds_on(state.messages, written.messages,
                                          written.last_message) \
        and builds_on(state.tool_results, written.tool_results, written.last_result)


def split_checkpoint(state: RunState, written: Written) -> CheckpointWrite:
    reset = not _extends(state, written)
    if reset:
        written = Written()
    # Only what the list lacks is converted: the constants once, the new items only.
    changes: dict[str, Any] = {"messages": state.messages[written.messages:],
                               "tool_results": state.tool_results[written.tool_results:]}
    if written.constant:
        changes.update(prompt="", context=None, client_tools=())
    whole = to_checkpoint(state.evolve(**changes))
    entries: list[str] = []
    if not written.constant:
        entries.append(orjson.dumps(["c", {name: whole[name] for name in CONSTANT}]).decode())
    entries += [orjson.dumps(["m", m]).decode() for m in whole["messages"]]
    entries += [orjson.dumps(["r", r]).decode() for r in whole["tool_results"]]
    small = {name: value for name, value in whole.items()
             if name not in CONSTANT and name not in GROWING}
    small["parts"] = {"messages": len(state.messages), "tool_results": len(state.tool_results)}
    return CheckpointWrite(small, tuple(entries), reset, Written(
        len(state.messages), len(state.tool_results), True,
        state.messages[-1] if state.messages else None,
        state.tool_results[-1] if state.tool_results else None))


def join_checkpoint(checkpoint: dict[str, Any], entries: list[str]) -> RunState | None:
    """The state of a record's checkpoint and the run's parts list; None when the parts
    do not hold what the checkpoint counts. A checkpoint without `parts` is whole."""
    data = dict(checkpoint)
    parts = data.pop("parts", None)
    if not isinstance(parts, dict):
        return from_checkpoint(data)
    constant: dict[str, Any] | None = None
    found: dict[str, list[Any]] = {"m": [], "r": []}
    for raw in entries:
        kind, value = orjson.loads(raw)
        if kind == "c":
            constant = value
        else:
            found[kind].append(value)
    messages, results = int(parts.get("messages", 0)), int(parts.get("tool_results", 0))
    if constant is None or len(found["m"]) < messages or len(found["r"]) < results:
        return None
    data.update(constant, messages=found["m"][:messages], tool_results=found["r"][:results])
    return from_checkpoint(data)
