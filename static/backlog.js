// Events that arrive while the page loads the history (GET /v1/documents/{id}/history),
// free of the DOM (tests/js runs it under node). The transcript holds them back, draws
// the history, then replays them, so nothing drawn meanwhile is wiped. The history was
// read at some moment during the load, so it may already have some of them: a run's
// prompt (recorded when the run starts) and finished messages (recorded around their
// message.done; an answer cut short is recorded as "interrupted"). `coveredByHistory`
// says which, so the replay draws them once.

/**
 * @param {{role: string, content: string, run_id?: string, interrupted?: boolean}[]} history
 * @param {{type: string, run_id?: string, message_id?: string, delta?: string, text?: string}[]} events
 *   the events held back, in order
 * @returns {{prompts: Set<string>, messages: Set<string>}} the runs whose prompt, and the
 *   messages whose text, the history already has
 */
export function coveredByHistory(history, events) {
  const prompts = new Set(history.filter((m) => m.role === "user" && m.run_id).map((m) => m.run_id));
  /** @type {Map<string, Map<string, {id: string, text: string, done: boolean, gone: boolean}>>} */
  const runs = new Map();
  for (const event of events) {
    if (!event.type.startsWith("message.") || !event.run_id || !event.message_id) continue;
    if (!runs.has(event.run_id)) runs.set(event.run_id, new Map());
    const messages = runs.get(event.run_id);
    if (!messages.has(event.message_id)) {
      messages.set(event.message_id, { id: event.message_id, text: "", done: false, gone: false });
    }
    const message = messages.get(event.message_id);
    if (event.type === "message.delta") message.text += event.delta ?? "";
    if (event.type === "message.done") Object.assign(message, { text: event.text ?? "", done: true });
    if (event.type === "message.discarded") message.gone = true;
  }
  const covered = new Set();
  for (const [runId, messages] of runs) {
    const held = [...messages.values()].filter((m) => !m.gone);
    const entries = history.filter((m) => m.role === "assistant" && m.run_id === runId);
    // The run's messages the history has are the first of those held back and the
    // last of its entries: the longest such overlap.
    for (let n = Math.min(held.length, entries.length); n > 0; n -= 1) {
      const tail = entries.slice(-n);
      if (tail.every((entry, i) => sameMessage(entry, held[i]))) {
        for (const message of held.slice(0, n)) covered.add(message.id);
        break;
      }
    }
  }
  return { prompts, messages: covered };
}

/** A finished message has the entry's text; an unfinished one (deltas only, perhaps
 * from the middle on) ends the entry of an interrupted answer. */
function sameMessage(entry, message) {
  const content = String(entry.content ?? "");
  return message.done ? !entry.interrupted && content === message.text
    : Boolean(entry.interrupted) && content.endsWith(message.text);
}
