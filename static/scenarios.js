// The scenarios menu: scripted runs (PROTOCOL.md section 9; they need the
// scripted model, the default without an API key) that each show one feature,
// with the way each should end so the page can say whether it did.
//
// An entry may name a `requires` feature: it is shown only when the server's
// `welcome.features` (protocol 1.1, section 10 onwards) lists it. Servers
// that speak 1.0 send no `features`, so those entries stay hidden for now.

/**
 * @typedef {{prompt: string, mode?: "agent"|"chat", options?: object, context?: object,
 *   threadId?: string, workflow?: string}} RunRequest
 * @typedef {{id: string, title: string, what: string, todo?: string,
 *   expect: {status: string, reason?: string}, requires?: string, needsWorkflow?: boolean,
 *   request: (doc: {text: string, version: number}, server: {workflow?: string}) => RunRequest}} Scenario
 */

const script = (steps, { chunk = 4, delayMs = 25 } = {}) =>
  JSON.stringify({ script: steps, chunk_chars: chunk, delay_ms: delayMs });

const LONG = "Co-writing means the agent works in the same document as you. " +
  "Every piece of this answer arrives as a message.delta event, numbered with a seq, " +
  "logged, and replayed to any tab that reconnects. ";

/** Where the first line ends (the whole text when it has one line). */
export const firstParagraphEnd = (text) => (text.includes("\n") ? text.indexOf("\n") : text.length);

/** @type {Scenario[]} */
export const SCENARIOS = [
  {
    id: "stream", title: "Streamed text",
    what: "The model streams a paragraph in small pieces (message.delta, then message.done).",
    expect: { status: "completed" },
    request: () => ({ prompt: script([{ say: LONG.trim() }], { chunk: 3, delayMs: 20 }) }),
  },
  {
    id: "client-tool", title: "Client tool",
    what: "The agent calls read_document, then insert_text: two tool round trips this tab executes.",
    expect: { status: "completed" },
    request: () => ({ prompt: script([
      { say: "Reading the document first. ", tool_calls: [{ name: "read_document", arguments: {} }] },
      { say: "Adding a line at the end. ", tool_calls: [{ name: "insert_text",
        arguments: { text: "\n\n(added by the client-tool scenario)", position: "end" } }] },
      { say: "Done: one read, one edit, both executed by this tab." },
    ]) }),
  },
  {
    id: "approval", title: "Approval",
    what: "The agent wants replace_document, which needs approval: approve, edit or reject it.",
    todo: "Answer the dialog.",
    expect: { status: "completed" },
    request: (doc) => ({ prompt: script([
      { say: "I'd like to put a title on the document; that replaces all of it, so I ask first. ",
        tool_calls: [{ name: "replace_document",
                       arguments: { text: `# Title from the approval scenario\n\n${doc.text}` } }] },
      { say: "Finished; the tool log shows what you decided." },
    ]) }),
  },
  {
    id: "abort", title: "Abort by typing",
    what: "A long answer streams; a user edit aborts the run at once (editor.change, origin user).",
    todo: "Type in the document while it streams.",
    expect: { status: "aborted", reason: "document_changed" },
    request: () => ({ prompt: script([{ say: LONG.repeat(12) }], { chunk: 2, delayMs: 40 }) }),
  },
  {
    id: "cancel", title: "Slow stream to cancel",
    what: "A very slow stream (a character every 150 ms); the run's user may cancel it.",
    todo: "Press Cancel.",
    expect: { status: "cancelled", reason: "user_cancelled" },
    request: () => ({ prompt: script([{ say: LONG.repeat(4) }], { chunk: 1, delayMs: 150 }) }),
  },
  {
    id: "failure", title: "Upstream failure",
    what: "The model fails after a few words (the scripted model's \"fail\" step), as a provider outage would.",
    expect: { status: "failed", reason: "upstream_error" },
    request: () => ({ prompt: script([{ say: "Starting to answer, and then… ",
                                        fail: "the scripted model failed on purpose" }]) }),
  },
  // -- Protocol 1.1 entries: hidden until welcome.features lists what they need. ------------
  // Add more here as the server gains them; `request` may use any 1.1 run.start field.
  {
    id: "edit-scope", title: "Edit elsewhere while it works", requires: "edit_scope",
    what: "The run works on the first paragraph only (context.scope, on_edit: overlap): " +
      "editing the last line does not abort it.",
    todo: "Type at the end of the document while it streams.",
    expect: { status: "completed" },
    request: (doc) => ({
      prompt: script([{ say: LONG.repeat(3) }], { chunk: 3, delayMs: 30 }),
      options: { on_edit: "overlap" },
      context: { document: { text: doc.text, version: doc.version },
                 scope: [{ from: 0, to: firstParagraphEnd(doc.text) }] },
    }),
  },
  {
    id: "queue", title: "Queue behind another run", requires: "run_queue",
    what: "Starts with if_busy: enqueue, so it waits (run.queued) when another tab's run is active.",
    expect: { status: "completed" },
    request: () => ({ prompt: script([{ say: "My turn came." }]), options: { if_busy: "enqueue" } }),
  },
  {
    id: "thread", title: "A side thread", requires: "threads",
    what: "Runs in thread \"side\": the model sees that thread's history only; unless " +
      "\"side\" is the thread shown, the run appears folded.",
    expect: { status: "completed" },
    request: () => ({ prompt: script([{ say: "Talking in the side thread." }]), threadId: "side" }),
  },
  {
    id: "workflow", title: "A workflow", requires: "workflows", needsWorkflow: true,
    what: "A scripted run under the first workflow GET /v1/workflows lists (run.start.workflow); " +
      "hidden when the server has none. The Workflows menu picks any.",
    expect: { status: "completed" },
    request: (_doc, { workflow } = {}) => ({
      prompt: script([{ say: `Working under the “${workflow}” workflow.` }]), workflow }),
  },
];

/**
 * The entries to show for a server that announced `features` (undefined for 1.0 servers).
 * An entry that `needsWorkflow` also needs a workflow on the server: `workflows` is
 * what `GET /v1/workflows` listed (empty, or not loaded yet: hidden).
 * @param {Scenario[]} scenarios
 * @param {string[]|undefined} features
 * @param {{workflows?: string[]}} [server]
 */
export function availableScenarios(scenarios, features, { workflows = [] } = {}) {
  const have = new Set(features ?? []);
  return scenarios.filter((s) => (!s.requires || have.has(s.requires)) &&
    (!s.needsWorkflow || workflows.length > 0));
}

/**
 * "as expected" or what differed, for a scenario's run.finished.
 * @returns {{ok: boolean, text: string}}
 */
export function judge(scenario, finished) {
  const got = `${finished.status}${finished.reason ? ` (${finished.reason})` : ""}`;
  const want = `${scenario.expect.status}${scenario.expect.reason ? ` (${scenario.expect.reason})` : ""}`;
  const ok = finished.status === scenario.expect.status &&
    (!scenario.expect.reason || finished.reason === scenario.expect.reason);
  return { ok, text: ok ? `ended ${got}, as expected` : `ended ${got}; expected ${want}` };
}
