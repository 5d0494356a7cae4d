"""The two-piece checkpoint (server/agent/checkpoint_parts.py), as a stateful property:
after every change of a run's state, what a survivor reads back (the record's
checkpoint through JSON, and the parts list) is that state exactly, and a write
sends only what was added since the last one (unless the list had to be reset)."""

from typing import Any

import orjson
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from protocol.client import ToolSpec
from server.agent.checkpoint import to_checkpoint
from server.agent.checkpoint_parts import Written, join_checkpoint, split_checkpoint
from server.agent.run_state import RunState

TEXT = st.text(max_size=20)


class CheckpointWrites(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state = RunState(
            run_id="r1", document_id="d1", mode="agent", user_id="alice", client_id="tab",
            prompt="write a poem " * 50, model="m", max_steps=50,
            client_tools=(ToolSpec(name="read", description="d", parameters={"type": "object"}),))
        self.written = Written()
        self.parts: list[str] = []
        self.record: dict[str, Any] = {}
        self.sent_last = 0
        self.added = 0
        self.reset_expected = True
        self._write()

    def _write(self) -> None:
        write = split_checkpoint(self.state, self.written)
        assert write.reset == self.reset_expected
        if write.reset:
            self.parts = []
        self.parts += write.entries
        self.record = orjson.loads(orjson.dumps({"checkpoint": write.checkpoint}))
        self.sent_last = len(write.entries)
        if not write.reset:
            assert self.sent_last == self.added, "only what was added is sent"
        self.written, self.added, self.reset_expected = write.written, 0, False

    @rule(content=TEXT)
    def model_turn(self, content: str) -> None:
        self.state = self.state.evolve(
            messages=(*self.state.messages, {"role": "assistant", "content": content}),
            step=self.state.step + 1)
        self.added += 1
        self._write()

    @rule(output=TEXT)
    def tool_result(self, output: str) -> None:
        self.state = self.state.evolve(
            messages=(*self.state.messages, {"role": "tool", "content": output}),
            tool_results=(*self.state.tool_results, {"name": "read", "status": "ok",
                                                      "output": output}))
        self.added += 2
        self._write()

    @rule(status=st.sampled_from(["running", "waiting_tool"]))
    def small_change(self, status: Any) -> None:
        self.state = self.state.evolve(status=status)
        self._write()

    @rule()
    def history_rewritten(self) -> None:
        """A state not built on what was written (e.g. equal items, other objects)."""
        self.state = self.state.evolve(messages=tuple(dict(m) for m in self.state.messages))
        self.reset_expected = bool(self.state.messages)
        self._write()

    @rule()
    def outcome_unknown(self) -> None:
        """A write whose reply was lost: the next one starts the list over."""
        self.written, self.reset_expected = Written(), True
        self._write()

    @invariant()
    def a_survivor_reads_the_state_back(self) -> None:
        assert join_checkpoint(self.record["checkpoint"], list(self.parts)) == self.state


TestCheckpointWrites = CheckpointWrites.TestCase
TestCheckpointWrites.settings = settings(max_examples=60, stateful_step_count=30,
                                         deadline=None)


def test_a_whole_checkpoint_still_reads_and_missing_parts_are_refused() -> None:
    state = RunState(run_id="r1", document_id="d1", mode="agent", user_id="alice",
                     client_id="tab", prompt="p", model="m", max_steps=5,
                     messages=({"role": "user", "content": "p"},))
    assert join_checkpoint(to_checkpoint(state), []) == state
    write = split_checkpoint(state, Written())
    assert join_checkpoint(write.checkpoint, list(write.entries)) == state
    assert join_checkpoint(write.checkpoint, list(write.entries[:1])) is None
    assert len(orjson.dumps(write.checkpoint)) < len(orjson.dumps(to_checkpoint(state))) + 40
