// Edit-aware runs on the client side (PROTOCOL.md section 11), as pure functions:
// what changed between two texts, whether a change touches a run's scope, where
// the scope goes after it, and whether a tool call was computed on a document that
// has since moved on in that scope. client.js re-exports all of it.
//
// The arithmetic is the server's (server/agent/scope.py), rule for rule, so the
// client and the server agree on which edits overlap:
// - a change {from, to, insert} replaces [from, to) of the document before it by
//   `insert` units (here: JavaScript string indices, i.e. UTF-16 code units);
// - it overlaps a range [a, b) when from < b and to > a, except a no-op
//   (from == to, insert == 0), which changes nothing;
// - an insertion exactly at a range's start goes before it (the range moves right),
//   one exactly at its end goes after it (the range stays).

/**
 * @typedef {{from: number, to: number}} ScopeRange
 * @typedef {{from: number, to: number, insert: number}} EditChange
 * @typedef {{version: number|string|undefined, origin: "user"|"agent", changes: EditChange[]|null}} EditRecord
 */

const isHigh = (code) => code >= 0xd800 && code <= 0xdbff;
const isLow = (code) => code >= 0xdc00 && code <= 0xdfff;

/**
 * The single change that turns `before` into `after`, or null when they are equal.
 *
 * Two texts do not say where an edit happened ("aa" -> "aaa" may be a typed "a"
 * anywhere), and for a scope the place matters. `cursor`, the caret's offset in
 * `after` right after the edit (a textarea's selectionEnd in its `input` event),
 * settles it: the inserted text ends at the cursor whenever the texts allow that.
 * Without it the change is placed as far right as possible. The change never
 * splits a surrogate pair, so `insert` counts whole characters' code units.
 * @param {string} before
 * @param {string} after
 * @param {number} [cursor]
 * @returns {EditChange|null}
 */
export function diffChange(before, after, cursor) {
  if (before === after) return null;
  const shorter = Math.min(before.length, after.length);
  const sameAt = (i) => before.charCodeAt(i) === after.charCodeAt(i);
  const sameFromEnd = (i) =>
    before.charCodeAt(before.length - 1 - i) === after.charCodeAt(after.length - 1 - i);
  let prefix = 0;
  let suffix = 0;
  if (typeof cursor === "number" && cursor >= 0 && cursor <= after.length) {
    // The unchanged tail starts at or after the cursor; the head takes what is left.
    const tailLimit = Math.min(shorter, after.length - cursor);
    while (suffix < tailLimit && sameFromEnd(suffix)) suffix += 1;
    while (prefix < shorter - suffix && sameAt(prefix)) prefix += 1;
  } else {
    while (prefix < shorter && sameAt(prefix)) prefix += 1;
    while (suffix < shorter - prefix && sameFromEnd(suffix)) suffix += 1;
  }
  if (prefix > 0 && isHigh(before.charCodeAt(prefix - 1))) prefix -= 1;
  if (suffix > 0 && isLow(before.charCodeAt(before.length - suffix))) suffix -= 1;
  return { from: prefix, to: before.length - suffix, insert: after.length - suffix - prefix };
}

/** True when the change touches a unit of the range (edges and no-ops do not). */
export function changeOverlaps(change, range) {
  if (change.from === change.to && change.insert === 0) return false;
  return change.from < range.to && change.to > range.from;
}

/**
 * Where `range` is after a change that does not overlap it: moved by the length
 * difference when the change is at or before its start, unchanged otherwise.
 * @param {ScopeRange} range
 * @param {EditChange} change
 * @returns {ScopeRange}
 */
export function shiftRange(range, change) {
  if (changeOverlaps(change, range)) throw new RangeError("the change overlaps the range");
  if ((change.from === change.to && change.insert === 0) || change.to > range.from) return range;
  const delta = change.insert - (change.to - change.from);
  return { from: range.from + delta, to: range.to + delta };
}

/**
 * The scope after `changes` (in order, each in the coordinates the previous one
 * left), or null as soon as one of them overlaps a range.
 * @param {ScopeRange[]} scope
 * @param {EditChange[]} changes
 * @returns {ScopeRange[]|null}
 */
export function applyChanges(scope, changes) {
  let current = scope;
  for (const change of changes) {
    if (current.some((range) => changeOverlaps(change, range))) return null;
    current = current.map((range) => shiftRange(range, change));
  }
  return current;
}

/**
 * Where `range` is after a change that may overlap it: a change inside the range
 * (the agent editing its own scope) grows or shrinks it instead of ending it.
 * (Not re-exported by client.js; the test page's scope view uses it.)
 * @param {ScopeRange} range
 * @param {EditChange} change
 * @returns {ScopeRange}
 */
export function absorb(range, change) {
  if (!changeOverlaps(change, range)) return shiftRange(range, change);
  const delta = change.insert - (change.to - change.from);
  return { from: Math.min(range.from, change.from), to: Math.max(range.to, change.to) + delta };
}

/**
 * The stale-call rule: should this client refuse a `tool.call` with
 * `tool.result.error {code: "stale"}` instead of running it?
 *
 * Yes when the call was computed on an older document (`callVersion` below
 * `currentVersion`) and a user edit made after `callVersion` touched the run's
 * scope. The scope is known at `scopeVersion` (the run's `context.document.version`,
 * or the latest `run.scope` event); the edits are replayed from there, in order:
 * agent edits (the run's own tool calls) move or resize the scope and never count
 * as stale, user edits up to `callVersion` only move it (the model knew about
 * them), and any later user edit that overlaps it makes the call stale.
 *
 * Decisions where the protocol is silent:
 * - versions that are not both numbers cannot be ordered: never stale;
 * - no scope (null) is the whole document: any later user edit makes it stale;
 * - an edit whose `changes` are unknown (null) overlaps everything, and once the
 *   scope cannot be followed (an earlier edit overlapped it with `on_edit`
 *   "continue", or an agent edit without changes) the whole document counts;
 * - `complete: false` (the client forgot edits this old) answers stale: a
 *   refused call costs the model one more read, a wrong edit costs the user text.
 * @param {{callVersion: unknown, currentVersion: unknown, scope: ScopeRange[]|null,
 *   scopeVersion: unknown, edits: EditRecord[], complete?: boolean}} state
 * @returns {boolean}
 */
export function isStaleCall({ callVersion, currentVersion, scope, scopeVersion, edits,
                              complete = true }) {
  if (typeof callVersion !== "number" || typeof currentVersion !== "number") return false;
  if (callVersion >= currentVersion) return false;
  if (!complete) return true;
  let ranges = typeof scopeVersion === "number" || scope === null ? scope : null;
  for (const edit of edits) {
    if (typeof edit.version !== "number") continue;
    if (typeof scopeVersion === "number" && edit.version <= scopeVersion) continue;
    const late = edit.version > callVersion;
    if (edit.origin === "user" && late) {
      if (edit.changes === null || ranges === null) {
        if (edit.changes === null || edit.changes.some((c) => !(c.from === c.to && c.insert === 0))) {
          return true;
        }
        continue;
      }
      const moved = applyChanges(ranges, edit.changes);
      if (moved === null) return true;
      ranges = moved;
    } else if (ranges !== null) {
      if (edit.changes === null) ranges = null;
      else if (edit.origin === "agent") {
        ranges = edit.changes.reduce((acc, change) => acc.map((r) => absorb(r, change)), ranges);
      } else {
        ranges = applyChanges(ranges, edit.changes);
      }
    }
  }
  return false;
}
