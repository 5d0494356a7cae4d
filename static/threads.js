// Threads and workflows (protocol 1.1, section 14) as the test page sees them,
// free of the DOM (tests/js runs it under node): thread names, the switcher's
// list, which runs belong to another thread, and the workflows menu's groups.

/** The server's rule for `run.start.thread_id` (and `?thread=`). */
export const THREAD_ID_RE = /^[A-Za-z0-9._:-]{1,64}$/;
export const DEFAULT_THREAD = "main";

/** Why `name` cannot be a thread id, or null when it can. */
export function threadIdProblem(name) {
  if (!name) return "a thread needs a name";
  if (name.length > 64) return `the name is ${name.length} characters long; the limit is 64`;
  if (!THREAD_ID_RE.test(name)) return "use letters, digits and . _ : - only";
  return null;
}

/**
 * The switcher's entries: the server's threads (`GET .../threads`, newest first) plus
 * the current one and "main" when the server does not know them yet (a thread exists
 * on the server only once a run was started in it).
 * @param {{thread_id: string, runs: number, last_ts: number|null}[]} threads
 * @param {string} current
 * @returns {{thread_id: string, runs: number, label: string}[]}
 */
export function threadEntries(threads, current) {
  const entries = threads.map((t) => ({ thread_id: t.thread_id, runs: t.runs }));
  for (const name of [current, DEFAULT_THREAD]) {
    if (!entries.some((t) => t.thread_id === name)) entries.push({ thread_id: name, runs: 0 });
  }
  return entries.map((t) => ({
    ...t, label: `${t.thread_id} · ${t.runs === 0 ? "new" : `${t.runs} run${t.runs === 1 ? "" : "s"}`}` }));
}

/**
 * Which thread each run belongs to, learnt from `run.started.thread_id` (a 1.0
 * server sends none: "main"). A run this tab never saw start (active when it
 * connected; the snapshot does not say its thread) counts as the current thread
 * unless `markOther` said otherwise.
 */
export class RunThreads {
  constructor() {
    /** @type {Map<string, string|null>} run_id -> thread (null: another, unnamed one) */
    this.runs = new Map();
  }

  /** @param {{run_id: string, thread_id?: string}} started a run.started event */
  started(started) {
    this.runs.set(started.run_id, started.thread_id ?? DEFAULT_THREAD);
  }

  /** A run known to be in some other thread than the one shown, name unknown. */
  markOther(runId) {
    if (!this.runs.has(runId)) this.runs.set(runId, null);
  }

  /** True when the run's events belong folded: the run is in a thread other than `current`. */
  isOther(runId, current) {
    if (!runId || !this.runs.has(runId)) return false;
    return this.runs.get(runId) !== current;
  }

  /** The run's thread name for a label ("another thread" when unknown). */
  name(runId) {
    return this.runs.get(runId) ?? "another thread";
  }
}

/**
 * `GET /v1/workflows` grouped for the menu: categories in alphabetical order
 * (uncategorised ones last, as "other"), workflows in the order the operator wrote them.
 * @param {{name: string, title?: string, description?: string, category?: string|null,
 *   mode?: string}[]} workflows
 * @returns {{category: string, workflows: typeof workflows}[]}
 */
export function groupWorkflows(workflows) {
  const groups = new Map();
  for (const workflow of workflows) {
    const category = workflow.category || "other";
    if (!groups.has(category)) groups.set(category, []);
    groups.get(category).push(workflow);
  }
  const order = (name) => (name === "other" ? "\uffff" : name.toLowerCase());
  return [...groups.entries()].sort(([a], [b]) => order(a).localeCompare(order(b)))
    .map(([category, list]) => ({ category, workflows: list }));
}
