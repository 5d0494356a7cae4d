// The agent's side of the page: transcript, tool-call log and timing chips,
// driven by the client's events. Timings are measured in this tab, from the
// moment the user sent the prompt (or picked a scenario).

import { approvalChip, finishChip } from "./rules.js";
import { DEFAULT_THREAD, RunThreads } from "./threads.js";

const $ = (id) => /** @type {HTMLElement} */ (document.getElementById(id));

export function promptLabel(prompt) {
  try { if (JSON.parse(prompt).script) return "(scripted run)"; } catch { /* free text */ }
  return prompt;
}

export class Transcript {
  /** @param {import("./client.js").CowriteClient} client */
  constructor(client) {
    this.client = client;
    this.list = $("transcript");
    /** @type {Map<string, HTMLElement>} message_id -> bubble */ this.bubbles = new Map();
    this.thinking = null;
    this.timing = { submit: 0, first: 0, tools: new Map() };
    // Threads (1.1): runs of a thread other than the shown one are folded and dimmed.
    /** @type {() => string} */ this.thread = () => DEFAULT_THREAD;
    this.runThreads = new RunThreads();
    /** @type {Map<string, {box: HTMLDetailsElement, head: HTMLElement, text: HTMLElement}>} */
    this.folds = new Map();
    this.#listen();
  }

  add(kind, text) {
    const element = document.createElement("div");
    element.className = `msg ${kind}`;
    element.textContent = text;
    this.list.append(element);
    this.list.scrollTop = this.list.scrollHeight;
    return element;
  }

  notice(text, bad = false) {
    return this.add(`notice${bad ? " bad" : ""}`, text);
  }

  /** The user asked for a run: clear the chips and start the clock. */
  startTiming() {
    $("timings").textContent = "";
    Object.assign(this.timing, { submit: performance.now(), first: 0 });
    this.timing.tools.clear();
  }

  stopTiming() {
    this.timing.submit = 0;
  }

  /** A fresh start (or a lost resume): the transcript comes from the history endpoint. */
  rebuild(messages) {
    this.list.textContent = "";
    this.bubbles.clear();
    this.folds.clear();
    for (const m of messages) {
      if (m.role === "user") this.add("user", promptLabel(m.content));
      else if (m.role === "assistant") {
        this.add("assistant", m.content + (m.interrupted ? " …(interrupted)" : ""));
      }
    }
  }

  /**
   * The folded entry of a run in another thread (created on its first event), or null
   * when the run belongs to the thread shown.
   */
  #fold(runId, prompt = null) {
    if (!this.runThreads.isOther(runId, this.thread())) return null;
    let fold = this.folds.get(runId);
    if (!fold) {
      const box = document.createElement("details");
      box.className = "msg other-thread";
      box.dataset.run = runId;
      box.dataset.thread = this.runThreads.name(runId);
      const head = document.createElement("summary");
      head.textContent = `thread “${this.runThreads.name(runId)}”: ${prompt === null ? "a run" : promptLabel(prompt)}`;
      const text = document.createElement("div");
      box.append(head, text);
      this.list.append(box);
      this.list.scrollTop = this.list.scrollHeight;
      fold = { box, head, text };
      this.folds.set(runId, fold);
    }
    return fold;
  }

  #chip(label, ms) {
    const chip = document.createElement("span");
    chip.textContent = `${label} ${ms.toFixed(0)} ms`;
    $("timings").append(chip);
  }

  #unthink() {
    if (this.thinking) { this.thinking.remove(); this.thinking = null; }
  }

  #toolItem(callId) {
    let item = document.querySelector(`#tool-log [data-call="${CSS.escape(callId)}"]`);
    if (!item) {
      item = document.createElement("li");
      item.dataset.call = callId;
      $("tool-log").append(item);
    }
    return /** @type {HTMLElement} */ (item);
  }

  #listen() {
    const on = (type, handler) => this.client.addEventListener(type, ({ detail }) => handler(detail));
    const mine = (run) => run.client_id === this.client.clientId;

    on("run.started", (run) => {
      this.runThreads.started(run);
      if (this.#fold(run.run_id, run.prompt)) return;
      this.add("user", promptLabel(run.prompt));
      this.thinking = this.add("assistant thinking", "thinking");
      if (mine(run) && this.timing.submit) this.#chip("→ run.started", performance.now() - this.timing.submit);
    });

    on("message.delta", (delta) => {
      const fold = this.#fold(delta.run_id);
      if (fold) { fold.text.textContent += delta.delta; return; }
      let bubble = this.bubbles.get(delta.message_id);
      if (!bubble) {
        this.#unthink();
        bubble = this.add("assistant", "");
        this.bubbles.set(delta.message_id, bubble);
        if (this.timing.submit && !this.timing.first) {
          this.timing.first = performance.now();
          this.#chip("→ first delta", this.timing.first - this.timing.submit);
        }
      }
      bubble.textContent += delta.delta;
      this.list.scrollTop = this.list.scrollHeight;
    });

    on("message.done", (done) => {
      const fold = this.#fold(done.run_id);
      if (fold) { fold.text.textContent = done.text; return; }
      const bubble = this.bubbles.get(done.message_id) ?? this.add("assistant", "");
      bubble.textContent = done.text;
      this.bubbles.set(done.message_id, bubble);
    });

    on("tool.call", (call) => {
      this.#unthink();
      this.timing.tools.set(call.call_id, performance.now());
      // An approved call keeps its "approved by" chip: name(args) · approved by x → client… ok
      const item = this.#toolItem(call.call_id);
      const approval = item.querySelector(".approval");
      item.replaceChildren(`${call.name}(${JSON.stringify(call.arguments).slice(0, 120)})`);
      if (approval) item.append(approval);
      item.append(Object.assign(document.createElement("b"), { textContent: ` → ${call.executor}…` }));
    });

    on("approval.requested", (request) => {
      this.#unthink();
      this.#toolItem(request.call_id).textContent = `${request.name} awaits approval`;
    });

    on("approval.resolved", (resolved) => {
      const item = this.#toolItem(resolved.call_id);
      item.querySelector(".approval")?.remove();
      item.append(Object.assign(document.createElement("span"), {
        className: `approval decision-${resolved.decision}`,
        textContent: ` · ${approvalChip(resolved.decision, resolved.user_id)}` }));
    });

    on("tool.done", (done) => {
      const item = this.#toolItem(done.call_id);
      item.querySelector("b")?.remove();
      item.append(Object.assign(document.createElement("b"), {
        className: `status-${done.status}`, textContent: ` ${done.status}` }));
      const started = this.timing.tools.get(done.call_id);
      if (started) this.#chip(`tool ${done.call_id.slice(-4)}`, performance.now() - started);
    });

    on("run.finished", (finished) => {
      const fold = this.#fold(finished.run_id);
      if (fold) fold.head.append(` · ${finished.status}${finished.reason ? ` (${finished.reason})` : ""}`);
      else this.#unthink();
      if (!fold) this.notice(`run ${finished.status}${finished.reason ? ` (${finished.reason})` : ""}` +
        `${finished.error ? `: ${finished.error.message}` : ""} · ${finished.steps} model call(s)`,
        finished.status !== "completed");
      if (this.timing.submit) { // this tab started the run
        this.#chip(finishChip(finished.status), performance.now() - this.timing.submit);
      }
      this.stopTiming();
    });

    on("document.changed", (change) => {
      if (change.client_id !== this.client.clientId && change.origin === "user") {
        this.notice(`${change.user_id} edited the document`);
      }
    });

    on("error", (error) => this.notice(`error ${error.code}: ${error.message}`, true));
  }
}
