"""Scope arithmetic for edit-aware runs (PROTOCOL.md section 11), pure.

A run's scope is a list of ranges `[from, to)`; a user's edit is a list of
changes, each replacing `[from, to)` of the document as it was before that
change with `insert` units. A change overlaps a range when it touches a
character of it, or inserts strictly inside it; any other change moves the
range (when it lies before it) or leaves it (when after).
"""

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Range:
    from_: int
    to: int


@dataclass(frozen=True, slots=True)
class Change:
    from_: int
    to: int
    insert: int


def overlaps(change: Change, span: Range) -> bool:
    if change.from_ < span.to and change.to > span.from_:
        return True
    return change.from_ == change.to and span.from_ < change.from_ < span.to


def shift(span: Range, change: Change) -> Range:
    """`span` after a change that does not overlap it: moved when the change lies
    before it (an insertion exactly at its start included), unchanged when after."""
    if change.to <= span.from_:
        delta = change.insert - (change.to - change.from_)
        return Range(span.from_ + delta, span.to + delta)
    return span


def apply(scope: list[Range], changes: list[Change]) -> list[Range] | None:
    """The scope after `changes`, in order; None when any change overlaps it."""
    current = list(scope)
    for change in changes:
        if any(overlaps(change, span) for span in current):
            return None
        current = [shift(span, change) for span in current]
    return current
