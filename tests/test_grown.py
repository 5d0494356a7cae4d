"""`Grown` and `GrownSet` (server/agent/grown.py) as stateful properties: versions made
by adding to any earlier version (the newest, as the run machine does, or an older
one, as after a transition whose publish failed) each behave exactly as the tuple or
frozenset they stand for, after every step, however the versions branched."""

import orjson
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from server.agent.checkpoint import from_checkpoint, to_checkpoint
from server.agent.grown import Grown, GrownSet, as_json, grown, with_added
from server.agent.run_state import RunState

ITEMS = st.integers(min_value=0, max_value=30)


class GrownVersions(RuleBasedStateMachine):
    """Every version kept, beside the tuple it must equal."""

    def __init__(self) -> None:
        super().__init__()
        self.versions: list[tuple[Grown[int], tuple[int, ...]]] = [(Grown(), ())]

    @rule(item=ITEMS)
    def add_to_newest(self, item: int) -> None:
        version, model = self.versions[-1]
        self.versions.append((version.plus(item), (*model, item)))

    @rule(pick=st.integers(min_value=0), item=ITEMS)
    def add_to_any(self, pick: int, item: int) -> None:
        version, model = self.versions[pick % len(self.versions)]
        self.versions.append((grown(version, item), (*model, item)))

    @rule(pick=st.integers(min_value=0), item=ITEMS)
    def add_to_a_tuple(self, pick: int, item: int) -> None:
        _, model = self.versions[pick % len(self.versions)]
        self.versions.append((grown(model, item), (*model, item)))

    @invariant()
    def every_version_is_its_tuple(self) -> None:
        for version, model in self.versions:
            assert len(version) == len(model)
            assert tuple(version) == model and list(reversed(version)) == list(reversed(model))
            assert version == model and model == version and version == list(model)
            assert as_json(version) == list(model)
            for index in range(-len(model), len(model)):
                assert version[index] == model[index]
            for index in (len(model), -len(model) - 1):
                with pytest.raises(IndexError):
                    version[index]
            for cut in (slice(None), slice(1, None), slice(None, -1), slice(None, None, 2),
                        slice(len(model) // 2, None), slice(None, None, -1)):
                assert version[cut] == model[cut]
            assert version != (*model, -1)


class GrownSetVersions(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.versions: list[tuple[GrownSet[int], frozenset[int]]] = [(GrownSet(), frozenset())]

    @rule(pick=st.integers(min_value=0), items=st.lists(ITEMS, max_size=3))
    def add(self, pick: int, items: list[int]) -> None:
        version, model = self.versions[pick % len(self.versions)]
        self.versions.append((with_added(version, items), model | set(items)))

    @precondition(lambda self: len(self.versions) > 1)
    @rule(pick=st.integers(min_value=0), items=st.lists(ITEMS, max_size=3))
    def add_to_a_frozenset(self, pick: int, items: list[int]) -> None:
        _, model = self.versions[pick % len(self.versions)]
        self.versions.append((with_added(model, items), model | set(items)))

    @invariant()
    def every_version_is_its_set(self) -> None:
        for version, model in self.versions:
            assert len(version) == len(model)
            assert frozenset(version) == model and version == model and model == version
            assert sorted(version) == sorted(model) == as_json(version)
            for item in range(-1, 32):
                assert (item in version) == (item in model)
            assert version != model | {99}


TestGrown = GrownVersions.TestCase
TestGrown.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestGrownSet = GrownSetVersions.TestCase
TestGrownSet.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def test_a_state_with_grown_collections_round_trips_through_its_checkpoint() -> None:
    """What another instance reads back (JSON) equals the state the machine built."""
    state = RunState(run_id="r", document_id="d", mode="agent", user_id="u", client_id="c",
                     prompt="p", model="m", max_steps=5)
    state = state.evolve(
        messages=grown(grown(state.messages, {"role": "user", "content": "a"}),
                       {"role": "tool", "content": "b"}),
        tool_results=grown(state.tool_results, {"name": "read", "status": "ok", "output": 1}),
        call_ids=with_added(state.call_ids, ["call_b", "call_a"]),
        completed_calls=with_added(state.completed_calls, ["call_a"]))
    data = orjson.loads(orjson.dumps(to_checkpoint(state)))
    assert data["call_ids"] == ["call_a", "call_b"]
    assert from_checkpoint(data) == state


def test_iterating_a_version_while_a_newer_one_grows_sees_that_version_only() -> None:
    """A consumer may hold an iterator across an await while the run's state grows."""
    items, names = Grown([1, 2]), GrownSet(["a", "b"])
    item_iterator, name_iterator = iter(items), iter(names)
    assert next(item_iterator) == 1 and next(name_iterator) == "a"
    newer, newer_names = items.plus(3), names.plus(["c"])
    assert list(item_iterator) == [2] and list(name_iterator) == ["b"]
    assert list(newer) == [1, 2, 3] and sorted(newer_names) == ["a", "b", "c"]
