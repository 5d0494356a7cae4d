"""`RunState.evolve`: the machine's fast copy must behave like `dataclasses.replace`."""

from dataclasses import replace

import pytest

from server.agent.run_state import RunState


def _state() -> RunState:
    return RunState(run_id="r1", document_id="d1", mode="agent", user_id="alice",
                    client_id="tab", prompt="p", model="m", max_steps=5)


def test_evolve_equals_replace_and_leaves_the_original_alone() -> None:
    state = _state()
    changed = state.evolve(step=3, messages=({"role": "user", "content": "hi"},))
    assert changed == replace(state, step=3, messages=({"role": "user", "content": "hi"},))
    assert (state.step, state.messages) == (0, ())


def test_evolve_refuses_unknown_fields_and_stays_frozen() -> None:
    state = _state()
    with pytest.raises(TypeError, match="stepp"):
        state.evolve(stepp=1)
    with pytest.raises(AttributeError):
        state.evolve(step=1).step = 2  # type: ignore[misc]
