"""Edit scopes: which parts of the document a run works on, and what a user edit does to them.

PROTOCOL.md section 11. A run started with `context.scope` (a list of ranges) and
`options.on_edit: "overlap"` survives user edits that do not touch its ranges; the
server shifts the ranges past each such edit and aborts the run on the first edit
that does touch one. This module is that arithmetic and nothing else: no I/O, no
asyncio, no imports from the rest of the server, so the run machine can call it from
a pure transition and the property tests can hold it against edits of a real string.

Offsets are in the editor's own unit (the bundled client uses JavaScript string
indices, i.e. UTF-16 code units). The server cannot measure the document in that
unit, so nothing here checks a range against the document's length: it only
compares and shifts.

Vocabulary:

- `Range(from_, to)`: the half-open range `[from_, to)`, `0 <= from_ <= to`. An empty
  range (`from_ == to`) is a point between two units: a cursor.
- `Change(from_, to, insert)`: the range `[from_, to)` of the document *before* the
  change is replaced by `insert` units of new content. A list of changes applies in
  order, each in the coordinates left by the previous one.

Decisions where the protocol is silent (each one is tested in tests/test_scope.py):

- Edges do not overlap. An insertion exactly at a range's start (`from == to == a`)
  goes *before* the range, which moves right by `insert`; an insertion exactly at its
  end (`from == to == b`) goes *after* it, and the range stays. A replacement that
  ends at `a` or starts at `b` touches no unit of the range either. For an empty
  range `[a, a)` both rules apply to an insertion at `a`; "start" wins, so the point
  moves right, past the new text (the same thing happens to a non-empty range that
  starts there).
- A no-op change (`from == to` and `insert == 0`) changes no unit, so it overlaps
  nothing and shifts nothing, even strictly inside a range. (Read literally, the
  protocol's `from < b and to > a` would call it an overlap; aborting a run over an
  edit that changed nothing would surprise everybody, and no editor would report it
  on purpose.)
- An empty range overlaps a change only when the change removes units on both sides
  of its point (`from < a < to`).
- `normalize_scope` sorts the ranges and merges those that share at least one unit
  (or where one's point lies strictly inside another), but keeps ranges that merely
  touch (`[0, 5)` and `[5, 9)`) apart: merging them would turn an insertion at 5,
  which is at the edge of both, into one strictly inside `[0, 9)`, i.e. an overlap.
- No scope (the whole document): every change except a no-op overlaps it, and an
  `editor.change` without `changes` overlaps every scope (`edit_overlaps`). An
  empty `changes` list says the edit changed nothing: it overlaps no scope, not even
  the whole document (section 11 makes only a *missing* `changes` overlap everything).
- Offsets are at most `MAX_OFFSET` (the wire schema refuses more), but a sum of them
  is not: a change that would move a range past `MAX_OFFSET` is an overlap for a
  person's edit (`apply`: the run ends `aborted`/`document_changed`) and makes the
  scope the whole document for the run's own (`follow` returns None).
"""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

MAX_SCOPE_RANGES = 256
"""Default cap on `context.scope` entries (a multi-cursor selection stays far below it)."""
MAX_CHANGES = 1024
"""Default cap on `editor.change.changes` entries of one message."""
MAX_OFFSET = 2**53 - 1
"""Largest offset accepted: the largest integer a JavaScript number holds exactly."""


class ScopeError(ValueError):
    """A scope or change list a client sent is not acceptable.

    `where` names the offending element the way `error.details` does (e.g.
    `context.scope.2.to`), `message` says what is wrong in words a client developer
    can act on; neither ever contains anything but the client's own numbers.
    """

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}")
        self.where = where
        self.message = message


@dataclass(frozen=True, slots=True)
class Range:
    """The half-open range `[from_, to)` of a document; `from_ == to` is a point."""

    from_: int
    to: int


@dataclass(frozen=True, slots=True)
class Change:
    """`[from_, to)` of the document before the change is replaced by `insert` new units."""

    from_: int
    to: int
    insert: int

    @property
    def delta(self) -> int:
        """How far the change moves everything after it (negative when it shrinks the text)."""
        return self.insert - (self.to - self.from_)

    @property
    def is_noop(self) -> bool:
        """Removes nothing and inserts nothing: no unit of the document changed."""
        return self.from_ == self.to and self.insert == 0


def overlaps(change: Change, range_: Range) -> bool:
    """True when `change` touches a unit of `range_` (see the module docstring for edges).

    `from < b and to > a` covers every change that removes a unit of the range and, for
    a pure insertion, one strictly inside it; a no-op is the one exception.
    """
    if change.is_noop:
        return False
    return change.from_ < range_.to and change.to > range_.from_


def shift(range_: Range, change: Change) -> Range:
    """Where `range_` is after a change that does not overlap it.

    A change at or before the range's start (`to <= a`, including an insertion exactly
    at `a`) moves it by `change.delta`; a change at or after its end leaves it.
    Raises ValueError for an overlapping change: the caller must check `overlaps`
    first, since an overlapping edit has no meaningful shifted range.
    """
    if overlaps(change, range_):
        raise ValueError("shift() of a range by a change that overlaps it")
    if change.is_noop or change.to > range_.from_:
        return range_  # the change lies at or after the range's end
    return Range(range_.from_ + change.delta, range_.to + change.delta)


def _pushed_out(before: Sequence[Range], after: Sequence[Range]) -> bool:
    """Did a change move a range past `MAX_OFFSET`? (Each offset of a change is at most
    that, but their sum is not: the shifted scope would hold numbers no JavaScript
    client reads exactly, and, past 2**64, none the server can even write.)"""
    return any(new.to > MAX_OFFSET and new.to > old.to
               for old, new in zip(before, after, strict=True))


def apply(scope: Sequence[Range], changes: Iterable[Change]) -> list[Range] | None:
    """The scope after `changes` (in order), or None when one of them overlapped a range.

    None is the `overlap` mode's verdict: abort the run (`aborted`/`document_changed`).
    A change that would move a range past `MAX_OFFSET` counts as an overlap: the
    scope cannot be followed any more. The ranges keep their order and count; an
    empty `changes` returns the scope as is.
    """
    current = list(scope)
    for change in changes:
        if any(overlaps(change, range_) for range_ in current):
            return None
        shifted = [shift(range_, change) for range_ in current]
        if _pushed_out(current, shifted):
            return None
        current = shifted
    return current


def grow(range_: Range, change: Change) -> Range:
    """Where `range_` is after a change of the run's own: shifted like a user's when it
    does not overlap; when it does, the range keeps what is left of its text and takes
    in the new text: `[min(a, from), max(b, to) + delta)`. The run wrote there, so
    that text is its work (an insertion inside grows the range, a deletion shrinks it,
    a replacement of all of it becomes the replacing text)."""
    if not overlaps(change, range_):
        return shift(range_, change)
    return Range(min(range_.from_, change.from_),
                 max(range_.to, change.to) + change.delta)


def follow(scope: Sequence[Range], changes: Iterable[Change]) -> list[Range] | None:
    """The scope after the run's own `changes` (in order): never an abort (`grow`).
    Ranges that the edits made share a unit are merged (`normalize_scope`'s rule).
    None, the whole document, once a change would move or grow a range past
    `MAX_OFFSET`: the run's own edit never ends it, and no range can follow it."""
    current = list(scope)
    for change in changes:
        grown = [grow(range_, change) for range_ in current]
        if _pushed_out(current, grown):
            return None
        current = grown
    return _merged(current)


def edit_overlaps(scope: Sequence[Range] | None, changes: Sequence[Change] | None) -> bool:
    """Does a user edit touch the run's scope? The rule for `on_edit: "overlap"`.

    `scope` None means the run works on the whole document; `changes` None means the
    `editor.change` did not say what changed, which overlaps everything (section 11).
    """
    if changes is None:
        return True
    if scope is None:
        return any(not change.is_noop for change in changes)
    return apply(scope, changes) is None


# -- validation of what a client sent -----------------------------------------------------


def _offset(value: int, where: str) -> int:
    # bool is an int subclass; a JSON true is not an offset.
    if isinstance(value, bool) or not isinstance(value, int):
        raise ScopeError(where, "must be an integer")
    if value < 0:
        raise ScopeError(where, f"must not be negative (got {value})")
    if value > MAX_OFFSET:
        raise ScopeError(where, f"must be at most {MAX_OFFSET} (got {value})")
    return value


def make_range(from_: int, to: int, where: str = "range") -> Range:
    """A validated Range: non-negative integer offsets with `from <= to`."""
    start, end = _offset(from_, f"{where}.from"), _offset(to, f"{where}.to")
    if start > end:
        raise ScopeError(where, f"from ({start}) must not be greater than to ({end})")
    return Range(start, end)


def make_change(from_: int, to: int, insert: int, where: str = "change") -> Change:
    """A validated Change: non-negative integers with `from <= to`."""
    start, end = _offset(from_, f"{where}.from"), _offset(to, f"{where}.to")
    count = _offset(insert, f"{where}.insert")
    if start > end:
        raise ScopeError(where, f"from ({start}) must not be greater than to ({end})")
    return Change(start, end, count)


def normalize_scope(ranges: Sequence[Range], *, limit: int = MAX_SCOPE_RANGES,
                    where: str = "context.scope") -> list[Range]:
    """Sorted scope with ranges that share a unit merged; touching ranges stay apart.

    Raises ScopeError for more than `limit` ranges (counted as sent, before merging,
    so the cap bounds the work) and for an invalid range. Exact duplicates collapse.
    """
    if len(ranges) > limit:
        raise ScopeError(where, f"at most {limit} ranges (got {len(ranges)})")
    return _merged([make_range(r.from_, r.to, f"{where}.{i}") for i, r in enumerate(ranges)])


def _merged(ranges: Sequence[Range]) -> list[Range]:
    merged: list[Range] = []
    for range_ in sorted(ranges, key=lambda r: (r.from_, r.to)):
        last = merged[-1] if merged else None
        if last is not None and (range_ == last or range_.from_ < last.to):
            merged[-1] = Range(last.from_, max(last.to, range_.to))
        else:
            merged.append(range_)
    return merged


def validate_changes(changes: Sequence[Change], *, limit: int = MAX_CHANGES,
                     where: str = "changes") -> list[Change]:
    """The changes, each validated, or ScopeError naming the first bad one or the count."""
    if len(changes) > limit:
        raise ScopeError(where, f"at most {limit} changes (got {len(changes)})")
    return [make_change(c.from_, c.to, c.insert, f"{where}.{i}") for i, c in enumerate(changes)]
