// The event inspector's model, free of the DOM (tests/js runs it under node):
// one record per event received or message sent, the filters, and a summary
// per run computed from the durable events' server timestamps.

/**
 * @typedef {{n: number, dir: "in"|"out", type: string, seq: number|null, run: string|null,
 *   at: number, local: boolean, size: number, replayed: boolean, event: object}} EventRecord
 *   `at`: the server's `ts` for durable events (so replayed events keep their
 *   original timing), the browser's clock for ephemeral and sent ones (`local`).
 */

const encoder = new TextEncoder();

/**
 * @param {object} event a server event or a client message
 * @param {{n: number, dir: "in"|"out", replayed?: boolean, now?: number}} how
 * @returns {EventRecord}
 */
export function makeRecord(event, { n, dir, replayed = false, now = Date.now() }) {
  const ts = typeof event.ts === "number" && dir === "in" ? event.ts : null;
  return {
    n, dir, type: String(event.type ?? "?"),
    seq: typeof event.seq === "number" ? event.seq : null,
    run: typeof event.run_id === "string" ? event.run_id : null,
    at: ts ?? now, local: ts === null,
    size: encoder.encode(JSON.stringify(event)).length,
    replayed, event,
  };
}

/** The type filter's special value: everything but the (many) deltas. */
export const NOT_DELTAS = "!message.delta";

/**
 * @param {EventRecord} record
 * @param {{type?: string, run?: string, sent?: boolean}} filter empty strings mean "all"
 */
export function matches(record, { type = "", run = "", sent = true }) {
  if (!sent && record.dir === "out") return false;
  if (type === NOT_DELTAS ? record.type === "message.delta" : type && record.type !== type) {
    return false;
  }
  return !run || record.run === run;
}

/** Short run id for narrow columns: "run_3f2a9c…" */
export function shortRun(runId) {
  return runId ? (runId.length > 12 ? `${runId.slice(0, 10)}…` : runId) : "";
}

/** "14:03:07.412" in the browser's time zone. */
export function clock(ms) {
  const d = new Date(ms);
  const two = (x) => String(x).padStart(2, "0");
  return `${two(d.getHours())}:${two(d.getMinutes())}:${two(d.getSeconds())}.` +
    String(d.getMilliseconds()).padStart(3, "0");
}

/** "1.2 KB", "87 B" */
export function bytes(size) {
  return size < 1024 ? `${size} B` : `${(size / 1024).toFixed(1)} KB`;
}

/**
 * @typedef {{run_id: string, status: string, reason: string|null, steps: number|null,
 *   messages: number, deltas: number, events: number, replayed: number,
 *   tools: {calls: number, done: number, avgMs: number|null, maxMs: number|null},
 *   approvals: {asked: number, approved: number, rejected: number, waitMs: number|null},
 *   firstDeltaMs: number|null, totalMs: number|null}} RunSummary
 */

/**
 * One summary per run, in the order runs first appear. Times come from the
 * durable events' `ts` (server clock), so a page that joined late or resumed
 * still gets the real durations. "Tool round trip" is tool.call -> tool.done.
 * @param {EventRecord[]} records
 * @returns {RunSummary[]}
 */
export function summarizeRuns(records) {
  /** @type {Map<string, any>} */
  const runs = new Map();
  for (const record of records) {
    if (record.dir !== "in" || !record.run || record.seq === null) continue;
    const e = /** @type {any} */ (record.event);
    let run = runs.get(record.run);
    if (!run) {
      run = { run_id: record.run, status: "running", reason: null, steps: null, messages: new Set(),
              deltas: 0, events: 0, replayed: 0, started: null, firstDelta: null, finished: null,
              calls: new Map(), trips: [], asked: new Map(), approved: 0, rejected: 0, waits: [] };
      runs.set(record.run, run);
    }
    run.events += 1;
    if (record.replayed) run.replayed += 1;
    switch (e.type) {
      case "run.started": run.started = e.ts; break;
      case "message.delta":
        run.deltas += 1;
        run.messages.add(e.message_id);
        if (run.firstDelta === null) run.firstDelta = e.ts;
        break;
      case "message.done": run.messages.add(e.message_id); break;
      case "tool.call": run.calls.set(e.call_id, e.ts); break;
      case "tool.done":
        if (run.calls.has(e.call_id)) run.trips.push(e.ts - run.calls.get(e.call_id));
        break;
      case "approval.requested": run.asked.set(e.call_id, e.ts); break;
      case "approval.resolved":
        if (e.decision === "approve") run.approved += 1; else run.rejected += 1;
        if (run.asked.has(e.call_id)) run.waits.push(e.ts - run.asked.get(e.call_id));
        break;
      case "run.finished":
        Object.assign(run, { status: e.status, reason: e.reason ?? null, steps: e.steps ?? null,
                             finished: e.ts });
        break;
      default: break;
    }
  }
  const since = (from, to) => (from !== null && to !== null ? to - from : null);
  const sum = (xs) => xs.reduce((a, b) => a + b, 0);
  return [...runs.values()].map((run) => ({
    run_id: run.run_id, status: run.status, reason: run.reason, steps: run.steps,
    messages: run.messages.size, deltas: run.deltas, events: run.events, replayed: run.replayed,
    tools: { calls: run.calls.size, done: run.trips.length,
             avgMs: run.trips.length ? sum(run.trips) / run.trips.length : null,
             maxMs: run.trips.length ? Math.max(...run.trips) : null },
    approvals: { asked: run.asked.size, approved: run.approved, rejected: run.rejected,
                 waitMs: run.waits.length ? sum(run.waits) : null },
    firstDeltaMs: since(run.started, run.firstDelta),
    totalMs: since(run.started, run.finished),
  }));
}
