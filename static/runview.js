// The test page's view of edit-aware and queued runs, free of the DOM (tests/js
// runs it under node): where the active run's scope is in the editor right now,
// the pieces of text the highlight marks, and the queue of waiting runs.

import { absorb, applyChanges } from "./edits.js";

/**
 * Follows one run's scope between the server's `run.scope` events. The server's
 * scope is authoritative at its `document_version`; this tab's own edits after
 * that version are replayed on top, so the highlight moves as the user types
 * instead of waiting for the round trip. User edits shift it (an overlapping one
 * ends in an abort or, with on_edit "continue", hides the highlight: the scope can
 * no longer be placed); the agent's edits inside it grow or shrink it.
 */
export class ScopeTracker {
  constructor() {
    /** @type {string|null} */ this.runId = null;
    /** @type {{from: number, to: number}[]|null} */ this.base = null;
    /** @type {number|null} */ this.version = null;
    /** @type {{version: number, origin: string, changes: {from: number, to: number, insert: number}[]}[]} */
    this.edits = [];
  }

  /** A run of this tab started with `scope` on the document at `version`. */
  start(runId, scope, version) {
    Object.assign(this, { runId, base: scope ?? null, version, edits: [] });
  }

  /** A `run.scope` event: the server's scope; this tab's edits up to its version are in it. */
  onScopeEvent(event) {
    if (this.runId !== null && event.run_id !== this.runId) return;
    this.runId = event.run_id;
    this.base = event.scope;
    this.version = typeof event.document_version === "number" ? event.document_version : null;
    this.edits = this.version === null ? [] : this.edits.filter((e) => e.version > this.version);
  }

  /** This tab changed the document (the user typed, or a tool of the run edited it). */
  localEdit(version, changes, origin = "user") {
    if (this.base !== null && changes) this.edits.push({ version, origin, changes });
  }

  /** The run ended: nothing to highlight. */
  finish(runId) {
    if (runId === this.runId) Object.assign(this, { runId: null, base: null, version: null, edits: [] });
  }

  /** The ranges to highlight now, or null for none. */
  current() {
    let ranges = this.base;
    for (const edit of this.edits) {
      if (ranges === null) return null;
      ranges = edit.origin === "agent"
        ? edit.changes.reduce((acc, change) => acc.map((r) => absorb(r, change)), ranges)
        : applyChanges(ranges, edit.changes);
    }
    return ranges;
  }
}

/**
 * The text cut into pieces for the highlight behind the textarea: marked pieces
 * are inside a range. Ranges are clamped to the text, sorted and merged; empty
 * ones (a cursor) are dropped, since there is nothing to colour.
 * @param {string} text
 * @param {{from: number, to: number}[]|null} ranges
 * @returns {{text: string, mark: boolean}[]}
 */
export function scopeSegments(text, ranges) {
  const clamp = (n) => Math.max(0, Math.min(text.length, n));
  const sorted = (ranges ?? []).map((r) => ({ from: clamp(r.from), to: clamp(r.to) }))
    .filter((r) => r.from < r.to).sort((a, b) => a.from - b.from);
  const pieces = [];
  let at = 0;
  for (const range of sorted) {
    const from = Math.max(at, range.from);
    if (range.to <= from) continue;
    if (from > at) pieces.push({ text: text.slice(at, from), mark: false });
    const last = pieces.at(-1);
    if (last?.mark && from === at) last.text += text.slice(from, range.to); // touching: one piece
    else pieces.push({ text: text.slice(from, range.to), mark: true });
    at = range.to;
  }
  if (at < text.length || pieces.length === 0) pieces.push({ text: text.slice(at), mark: false });
  return pieces;
}

/**
 * @typedef {{run_id: string, user_id: string, client_id: string, prompt?: string,
 *   position?: number}} QueuedRun
 */

/**
 * The queue of waiting runs after an event: `welcome.queued_runs` replaces it,
 * `run.queued` adds (or moves) a run, and `run.started` / `run.finished` of a
 * queued run take it out. Kept in the order the server gave (positions at enqueue
 * time); a run's place in line is its index + 1.
 * @param {QueuedRun[]} queue
 * @param {any} event
 * @returns {QueuedRun[]}
 */
export function updateQueue(queue, event) {
  switch (event.type) {
    case "welcome":
      return (event.queued_runs ?? []).map((run, i) => ({
        run_id: run.run_id, user_id: run.user_id, client_id: run.client_id,
        prompt: run.prompt, position: i + 1 }));
    case "run.queued": {
      const rest = queue.filter((run) => run.run_id !== event.run_id);
      const entry = { run_id: event.run_id, user_id: event.user_id, client_id: event.client_id,
                      prompt: event.prompt, position: event.position };
      const at = Math.max(0, Math.min(rest.length, (event.position ?? rest.length + 1) - 1));
      return [...rest.slice(0, at), entry, ...rest.slice(at)];
    }
    case "run.started": case "run.finished":
      return queue.some((run) => run.run_id === event.run_id)
        ? queue.filter((run) => run.run_id !== event.run_id) : queue;
    default:
      return queue;
  }
}
