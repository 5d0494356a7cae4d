"""Immutable collections that grow by one item in O(1): a run's history and call ids.

A run's state is a frozen value (`run_state.py`): each transition makes a new
one, and the old one stays valid (the driver keeps it until the transition is
logged; a failed publish leaves it in force). Its `messages`, `tool_results`,
`call_ids` and `completed_calls` grow by one or two items per tool call, and as
tuples and frozensets every addition copied the whole collection: a tool round
trip cost O(steps), 5% of the server's CPU per round trip at step 150 of a run
(`python -m bench.roundtrip`, 300 calls), more the longer the run.

Here successive versions share one list (one dict for a set) and each version
knows how many of its items are its own (`_size`). Adding to the newest version
appends to the shared storage in place; older versions do not see the new item,
since they read only their first `_size` entries. Adding to a version that is no
longer the newest (a transition whose publish failed, then a different one
from the same state) copies its own items first, so versions never disturb each
other: every version behaves as the tuple or frozenset it stands for
(tests/test_grown.py checks that against tuples and frozensets, with branching).

Both compare equal to the tuple (`Grown`) or set (`GrownSet`) of their items, and
code that needs a real tuple or list for an encoder gets one with `tuple()` or
`list()`.
"""

from collections.abc import Iterable, Iterator, Sequence, Set
from itertools import islice
from typing import Any, TypeVar, overload

_T = TypeVar("_T")


class Grown(Sequence[_T]):
    """An immutable sequence; `plus(item)` is a new one with `item` at the end."""

    __slots__ = ("_items", "_size")

    def __init__(self, items: Iterable[_T] = ()) -> None:
        self._items: list[_T] = list(items)
        self._size = len(self._items)

    def plus(self, item: _T) -> "Grown[_T]":
        items = self._items
        if len(items) != self._size:  # another version grew the shared list: branch off
            items = items[:self._size]
        items.append(item)
        grown: Grown[_T] = Grown.__new__(Grown)
        grown._items, grown._size = items, self._size + 1
        return grown

    def __len__(self) -> int:
        return self._size

    @overload
    def __getitem__(self, index: int) -> _T: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[_T, ...]: ...

    def __getitem__(self, index: int | slice) -> _T | tuple[_T, ...]:
        """An item, or a slice as a tuple (as a tuple's slice is one)."""
        if isinstance(index, slice):
            picked = range(self._size)[index]  # the slice's positions within this version
            if picked.step == 1:
                return tuple(self._items[picked.start:picked.stop])
            return tuple(self._items[at] for at in picked)
        if index < 0:
            index += self._size
        if not 0 <= index < self._size:
            raise IndexError("Grown index out of range")
        return self._items[index]

    def __iter__(self) -> Iterator[_T]:
        # The shared list only ever grows at its end, so this stays this version's items
        # even if a newer version appends while the iteration is suspended.
        return islice(self._items, self._size)

    def __reversed__(self) -> Iterator[_T]:
        return reversed(self._items[:self._size])

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Grown):
            return self._size == other._size and list(self) == list(other)
        if isinstance(other, (tuple, list)):
            return self._size == len(other) and list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # like a tuple of dicts: not hashable

    def __repr__(self) -> str:
        return f"Grown({list(self)!r})"


def grown(items: Sequence[_T], item: _T) -> Grown[_T]:
    """`items` (a `Grown`, or any sequence: a tuple from a checkpoint or a test) with
    `item` added at the end."""
    if isinstance(items, Grown):
        return items.plus(item)
    return Grown(items).plus(item)


class GrownSet(Set[_T]):
    """An immutable set; `plus(items)` is a new one with `items` added. The shared dict
    maps each item to the position it was added at: a version holds those below its
    size."""

    __slots__ = ("_order", "_size")

    def __init__(self, items: Iterable[_T] = ()) -> None:
        self._order: dict[_T, int] = {}
        for item in items:
            self._order.setdefault(item, len(self._order))
        self._size = len(self._order)

    def plus(self, items: Iterable[_T]) -> "GrownSet[_T]":
        order, size = self._order, self._size
        for item in items:
            if order.get(item, size) < size:
                continue  # already in this version
            if len(order) != size:  # another version grew the shared dict: branch off
                order = {key: at for key, at in order.items() if at < size}
            order[item] = size
            size += 1
        if size == self._size:
            return self
        added: GrownSet[_T] = GrownSet.__new__(GrownSet)
        added._order, added._size = order, size
        return added

    def __contains__(self, item: object) -> bool:
        at = self._order.get(item, self._size)  # type: ignore[arg-type]
        return bool(at < self._size)

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[_T]:
        # A copy: a newer version may add to the shared dict while the iteration is
        # suspended, which a dict's own iterator refuses. (A dict keeps insertion order.)
        return iter(list(islice(self._order, self._size)))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Set):
            return self._size == len(other) and all(item in other for item in self)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"GrownSet({list(self)!r})"


def with_added(items: Set[_T], added: Iterable[_T]) -> GrownSet[_T]:
    """`items` (a `GrownSet`, or any set: a frozenset from a checkpoint or a test) with
    `added` in it."""
    if isinstance(items, GrownSet):
        return items.plus(added)
    return GrownSet(items).plus(added)


def as_json(value: Any) -> Any:
    """A `Grown` as a list and a `GrownSet` as a sorted list, for an encoder; anything
    else as it is."""
    if isinstance(value, Grown):
        return list(value)
    if isinstance(value, GrownSet):
        return sorted(value)
    return value
