"""server/agent/scope.py: the rules of PROTOCOL.md section 11, by example and by property.

The property tests hold the arithmetic against a real document: every unit of the
text is a distinct token, each change really replaces tokens of a list, and the
question "did an edit touch the scope, and where did the scoped text go?" is answered
by looking at the tokens, not by any offset arithmetic. `apply` must agree exactly.
"""

from collections.abc import Iterator
from itertools import count, pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from server.agent.scope import (
    MAX_OFFSET,
    Change,
    Range,
    ScopeError,
    apply,
    edit_overlaps,
    follow,
    make_change,
    make_range,
    normalize_scope,
    overlaps,
    shift,
    validate_changes,
)

# -- the rules of section 11, one example each ----------------------------------------------


def test_an_edit_before_the_scope_shifts_it_by_the_length_difference() -> None:
    scope = [Range(10, 20)]
    assert apply(scope, [Change(2, 5, 7)]) == [Range(14, 24)]  # 3 units became 7
    assert apply(scope, [Change(0, 10, 0)]) == [Range(0, 10)]  # deleting all before it
    assert apply(scope, [Change(3, 3, 2)]) == [Range(12, 22)]  # a pure insertion


def test_an_edit_after_the_scope_leaves_it() -> None:
    assert apply([Range(10, 20)], [Change(25, 30, 0), Change(20, 21, 9)]) == [Range(10, 20)]


def test_an_insertion_exactly_at_an_edge_does_not_overlap() -> None:
    scope = Range(10, 20)
    at_start, at_end = Change(10, 10, 4), Change(20, 20, 4)
    assert not overlaps(at_start, scope) and not overlaps(at_end, scope)
    assert shift(scope, at_start) == Range(14, 24), "inserted at the start: goes before it"
    assert shift(scope, at_end) == Range(10, 20), "inserted at the end: goes after it"


def test_a_replacement_that_ends_or_starts_at_an_edge_does_not_overlap() -> None:
    scope = [Range(10, 20)]
    assert apply(scope, [Change(5, 10, 1)]) == [Range(6, 16)]
    assert apply(scope, [Change(20, 30, 1)]) == [Range(10, 20)]


@pytest.mark.parametrize("change", [
    Change(12, 12, 1),  # an insertion strictly inside
    Change(19, 19, 5),  # an insertion just before the last unit
    Change(12, 15, 0),  # a deletion inside
    Change(10, 20, 10),  # the whole range replaced, same length
    Change(5, 11, 0),  # reaches its first unit from before
    Change(19, 25, 3),  # reaches its last unit from after
    Change(0, 100, 100),  # covers it
])
def test_an_edit_touching_the_scope_overlaps(change: Change) -> None:
    assert overlaps(change, Range(10, 20))
    assert apply([Range(10, 20)], [change]) is None
    with pytest.raises(ValueError, match="overlaps"):
        shift(Range(10, 20), change)


def test_a_noop_change_overlaps_nothing_even_inside() -> None:
    noop = Change(15, 15, 0)
    assert not overlaps(noop, Range(10, 20))
    assert apply([Range(10, 20)], [noop]) == [Range(10, 20)]
    assert not edit_overlaps(None, [noop]), "not even the whole document"


def test_changes_apply_in_order_each_in_the_previous_ones_coordinates() -> None:
    # Insert 5 at 0 (scope -> [15, 25)), then delete [12, 15): in the new coordinates
    # that ends exactly at the scope's start, so it shifts it back to [12, 22).
    assert apply([Range(10, 20)], [Change(0, 0, 5), Change(12, 15, 0)]) == [Range(12, 22)]
    # Delete 5 at 0 (scope -> [5, 15)): [5, 6) now is the scope's first unit, [4, 5)
    # the unit just before it.
    assert apply([Range(10, 20)], [Change(0, 5, 0), Change(5, 6, 0)]) is None
    assert apply([Range(10, 20)], [Change(0, 5, 0), Change(4, 5, 0)]) == [Range(4, 14)]


def test_every_range_of_the_scope_is_checked_and_shifted() -> None:
    scope = [Range(0, 5), Range(10, 20), Range(30, 31)]
    assert apply(scope, [Change(7, 8, 3)]) == [Range(0, 5), Range(12, 22), Range(32, 33)]
    assert apply(scope, [Change(30, 30, 1)]) == [Range(0, 5), Range(10, 20), Range(31, 32)]
    assert apply(scope, [Change(7, 8, 3), Change(32, 33, 1)]) is None
    assert apply(scope, []) == scope


def test_an_empty_range_is_a_point_touched_only_across_it() -> None:
    point = Range(5, 5)
    assert not overlaps(Change(5, 5, 3), point)
    assert shift(point, Change(5, 5, 3)) == Range(8, 8), "an insertion at the point goes before it"
    assert shift(point, Change(5, 7, 0)) == point
    assert shift(point, Change(3, 5, 0)) == Range(3, 3)
    assert overlaps(Change(4, 6, 0), point)


def test_no_scope_is_the_whole_document_and_no_changes_overlap_everything() -> None:
    assert edit_overlaps(None, [Change(0, 0, 1)])
    assert edit_overlaps([Range(10, 20)], None), "an editor.change without changes"
    assert edit_overlaps([], None)
    assert not edit_overlaps([Range(10, 20)], [Change(0, 0, 1)])
    assert edit_overlaps([Range(10, 20)], [Change(11, 12, 1)])


# -- validation -----------------------------------------------------------------------------


def test_validation_names_the_bad_element() -> None:
    assert make_range(0, 0) == Range(0, 0)
    with pytest.raises(ScopeError) as info:
        make_range(5, 4, "context.scope.1")
    assert info.value.where == "context.scope.1"
    assert info.value.message == "from (5) must not be greater than to (4)"
    with pytest.raises(ScopeError, match=r"changes\.0\.insert: must not be negative \(got -1\)"):
        make_change(0, 0, -1, "changes.0")
    with pytest.raises(ScopeError, match=r"range\.from: must be an integer"):
        make_range(True, 2)
    with pytest.raises(ScopeError, match="must be at most"):
        make_change(0, MAX_OFFSET + 1, 0)
    with pytest.raises(ScopeError, match=r"changes\.1: from \(3\) must not be greater"):
        validate_changes([Change(0, 1, 0), Change(3, 2, 0)])
    with pytest.raises(ScopeError, match=r"changes: at most 2 changes \(got 3\)"):
        validate_changes([Change(0, 0, 1)] * 3, limit=2)
    with pytest.raises(ScopeError, match=r"context.scope: at most 1 ranges \(got 2\)"):
        normalize_scope([Range(0, 1), Range(2, 3)], limit=1)


def test_normalize_sorts_merges_shared_units_and_keeps_touching_ranges_apart() -> None:
    assert normalize_scope([Range(20, 30), Range(0, 5), Range(3, 8), Range(0, 5)]) == [
        Range(0, 8), Range(20, 30)]
    assert normalize_scope([Range(5, 9), Range(0, 5)]) == [Range(0, 5), Range(5, 9)]
    assert normalize_scope([Range(0, 10), Range(4, 4)]) == [Range(0, 10)], "a point inside"
    assert normalize_scope([Range(0, 10), Range(10, 10), Range(0, 0)]) == [
        Range(0, 0), Range(0, 10), Range(10, 10)], "points at the edges stay"
    assert normalize_scope([]) == []
    with pytest.raises(ScopeError, match=r"context\.scope\.1: from \(9\)"):
        normalize_scope([Range(0, 1), Range(9, 2)])


# -- properties against a real document -----------------------------------------------------

DOC_MAX = 24


@st.composite
def documents_scopes_and_edits(
    draw: st.DrawFn, *, empty_ranges: bool = False,
) -> tuple[int, list[Range], list[Change]]:
    """A document length, a scope inside it, and a sequence of valid changes."""
    length = draw(st.integers(0, DOC_MAX))
    scope: list[Range] = []
    for _ in range(draw(st.integers(0, 3))):
        a = draw(st.integers(0, length))
        b = draw(st.integers(a if empty_ranges else min(a + 1, length), length))
        if a < b or empty_ranges:
            scope.append(Range(a, b))
    changes: list[Change] = []
    size = length
    for _ in range(draw(st.integers(0, 4))):
        f = draw(st.integers(0, size))
        t = draw(st.integers(f, min(size, f + 6)))
        n = draw(st.integers(0, 5))
        changes.append(Change(f, t, n))
        size += n - (t - f)
    return length, scope, changes


def _tokens(ids: Iterator[int], n: int) -> list[int]:
    return [next(ids) for _ in range(n)]


def _edit_real_document(
    length: int, scope: list[Range], changes: list[Change],
) -> tuple[bool, list[int], list[list[int]]]:
    """Apply the changes to a list of unique tokens; report whether any touched scoped text.

    "Touched" is decided from the tokens alone: the change removed a token of a range,
    or it inserted new tokens between two tokens of the same range.
    """
    ids = count()
    doc = _tokens(ids, length)
    scoped = [doc[r.from_:r.to] for r in scope]
    members = [set(tokens) for tokens in scoped]
    touched = False
    for change in changes:
        removed = set(doc[change.from_:change.to])
        for tokens in members:
            inside = (change.from_ > 0 and change.from_ < len(doc)
                      and doc[change.from_ - 1] in tokens and doc[change.from_] in tokens)
            if removed & tokens or (change.insert > 0 and change.from_ == change.to and inside):
                touched = True
        doc[change.from_:change.to] = _tokens(ids, change.insert)
    return touched, doc, scoped


@given(documents_scopes_and_edits())
def test_apply_agrees_with_editing_a_real_string(
    case: tuple[int, list[Range], list[Change]],
) -> None:
    length, scope, changes = case
    touched, doc, scoped = _edit_real_document(length, scope, changes)
    result = apply(scope, changes)
    assert (result is None) == touched
    if result is not None:
        for before, after in zip(scoped, result, strict=True):
            assert doc[after.from_:after.to] == before, "the scoped text moved with its range"


@given(documents_scopes_and_edits(empty_ranges=True))
def test_shifted_scope_stays_valid_ordered_and_the_same_size(
    case: tuple[int, list[Range], list[Change]],
) -> None:
    length, scope, changes = case
    result = apply(scope, changes)
    if result is None:
        return
    final_length = length + sum(change.delta for change in changes)
    for before, after in zip(scope, result, strict=True):
        assert 0 <= after.from_ <= after.to <= final_length
        assert after.to - after.from_ == before.to - before.from_
    order = sorted(range(len(scope)), key=lambda i: (scope[i].from_, scope[i].to))
    assert [result[i].from_ for i in order] == sorted(r.from_ for r in result)


@given(documents_scopes_and_edits(empty_ranges=True))
def test_normalizing_a_scope_changes_no_verdict(
    case: tuple[int, list[Range], list[Change]],
) -> None:
    """Merged ranges abort exactly the runs the ranges as sent would have aborted."""
    _, scope, changes = case
    normal = normalize_scope(scope)
    assert edit_overlaps(normal, changes) == edit_overlaps(scope, changes)
    assert all(a.to <= b.from_ for a, b in pairwise(normal))
    shifted, shifted_normal = apply(scope, changes), apply(normal, changes)
    if shifted is not None and shifted_normal is not None:
        covered = {u for r in shifted for u in range(r.from_, r.to)}
        assert covered == {u for r in shifted_normal for u in range(r.from_, r.to)}


@given(st.integers(0, 50), st.integers(0, 50), st.integers(0, 50), st.integers(0, 50),
       st.integers(0, 10))
def test_overlap_is_the_protocols_formula_except_for_noops(
    a: int, b: int, f: int, t: int, n: int,
) -> None:
    a, b, f, t = min(a, b), max(a, b), min(f, t), max(f, t)
    expected = (f < b and t > a) or (f == t and a < f < b)
    assert overlaps(Change(f, t, n), Range(a, b)) == (expected and not (f == t and n == 0))


# -- the run's own edits: the scope follows its text --------------------------------------


def test_the_runs_own_edits_resize_the_range_they_touch() -> None:
    scope = [Range(10, 20)]
    assert follow(scope, [Change(12, 12, 30)]) == [Range(10, 50)]  # wrote inside: grows
    assert follow(scope, [Change(11, 19, 0)]) == [Range(10, 12)]  # deleted inside: shrinks
    assert follow(scope, [Change(5, 25, 3)]) == [Range(5, 8)]  # replaced it all
    # several changes, each in the previous one's coordinates; an overlapping one no
    # longer throws the others away (the scope stayed [10, 20))
    assert follow(scope, [Change(0, 0, 5), Change(16, 17, 1)]) == [Range(15, 25)]
    assert follow([Range(0, 4), Range(8, 12)], [Change(3, 9, 1)]) == [Range(0, 7)]  # merged


@given(documents_scopes_and_edits())
def test_follow_keeps_the_ranges_text_and_what_the_run_wrote_into_it(
    case: tuple[int, list[Range], list[Change]],
) -> None:
    """Against a real document: the range after the run's edits is exactly the span of
    what is left of its text plus the text its overlapping changes inserted."""
    length, scope, changes = case
    if len(scope) != 1:
        return
    ids = count()
    doc = _tokens(ids, length)
    ours = set(doc[scope[0].from_:scope[0].to])
    for change in changes:
        removed = set(doc[change.from_:change.to])
        inside = (0 < change.from_ < len(doc) and doc[change.from_ - 1] in ours
                  and doc[change.from_] in ours)
        touched = bool(removed & ours) or (change.insert > 0 and change.from_ == change.to
                                           and inside)
        new = _tokens(ids, change.insert)
        doc[change.from_:change.to] = new
        if touched:
            ours |= set(new)
    followed = follow(scope, changes)
    assert followed is not None, "far below MAX_OFFSET the scope is always followed"
    [result] = followed
    assert 0 <= result.from_ <= result.to <= len(doc)
    where = [i for i, token in enumerate(doc) if token in ours]
    if where:
        assert (result.from_, result.to) == (where[0], where[-1] + 1)
        assert len(where) == where[-1] + 1 - where[0]  # contiguous: nothing foreign inside
    else:
        assert result.from_ == result.to  # all of it deleted: a point where it was


# -- offsets near MAX_OFFSET: each offset is bounded, their sums are not ----------------------


def test_a_shift_past_max_offset_overlaps_a_persons_edit_and_frees_the_runs_own() -> None:
    scope = [Range(10, 20)]
    twice = [Change(0, 0, MAX_OFFSET), Change(0, 0, MAX_OFFSET)]
    assert apply(scope, twice) is None, "a person's edit: the run cannot follow its scope"
    assert edit_overlaps(scope, twice)
    assert follow(scope, twice) is None, "the run's own edit: the whole document"
    assert follow(scope, [Change(15, 15, MAX_OFFSET)]) is None, "grown past it"
    # up to MAX_OFFSET itself the scope is followed
    assert apply(scope, [Change(0, 0, MAX_OFFSET - 20)]) == [Range(MAX_OFFSET - 10, MAX_OFFSET)]
    assert follow(scope, [Change(15, 15, MAX_OFFSET - 20)]) == [Range(10, MAX_OFFSET)]
    # a change after the range, or one that shrinks the text, never pushes it out
    far = [Range(MAX_OFFSET - 1, MAX_OFFSET)]
    assert apply(far, [Change(MAX_OFFSET, MAX_OFFSET, MAX_OFFSET)]) == far
    assert apply(far, [Change(0, 5, 0)]) == [Range(MAX_OFFSET - 6, MAX_OFFSET - 5)]


def _unbounded_apply(scope: list[Range], changes: list[Change]) -> list[Range] | None:
    """`apply` as it was: overlap checks and shifts, no bound."""
    current = list(scope)
    for change in changes:
        if any(overlaps(change, range_) for range_ in current):
            return None
        current = [shift(range_, change) for range_ in current]
    return current


offsets = st.one_of(st.integers(0, 40), st.integers(MAX_OFFSET - 40, MAX_OFFSET))


@st.composite
def scopes_and_huge_changes(draw: st.DrawFn) -> tuple[list[Range], list[Change]]:
    """Valid offsets (each at most MAX_OFFSET), small or at the very end of the range."""
    scope = [Range(*sorted((draw(offsets), draw(offsets))))
             for _ in range(draw(st.integers(1, 3)))]
    changes = []
    for _ in range(draw(st.integers(1, 4))):
        f, t = sorted((draw(offsets), draw(offsets)))
        changes.append(Change(f, t, draw(offsets)))
    return scope, changes


@given(scopes_and_huge_changes())
def test_no_scope_ever_holds_an_offset_past_max_offset(
    case: tuple[list[Range], list[Change]],
) -> None:
    """Whatever valid changes a person or the run makes, the scope either stays inside
    the bound or is given up (`apply`: an overlap; `follow`: the whole document), and
    the bound changes no other verdict."""
    scope, changes = case
    pushed_out = False  # did some change, before any overlap, move a range past the bound?
    for done in range(1, len(changes) + 1):
        moved = _unbounded_apply(scope, changes[:done])
        if moved is None:
            break
        if any(r.to > MAX_OFFSET for r in moved):
            pushed_out = True
            break
    result, unbounded = apply(scope, changes), _unbounded_apply(scope, changes)
    assert (result is None) == (unbounded is None or pushed_out)
    if result is not None:
        assert result == unbounded
        assert all(0 <= r.from_ <= r.to <= MAX_OFFSET for r in result)
    followed = follow(scope, changes)
    if followed is not None:
        assert all(0 <= r.from_ <= r.to <= MAX_OFFSET for r in followed)
