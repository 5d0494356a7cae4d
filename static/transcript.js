// The agent's side of the page: transcript, tool-call log and timing chips,
// driven by the client's events. Timings are measured in this tab, from the
// moment the user sent the prompt (or picked a scenario).
//
// While the history loads (`load`), the events that draw the transcript and the tool
// log are held back and replayed once the history is drawn (backlog.js says which of
// them the history already shows), so the page ends as a tab that was there all along.

import { coveredByHistory } from "./backlog.js";
import { approvalChip, finishChip } from "./rules.js";
import { DEFAULT_THREAD, RunThreads } from "./threads.js";

const $ = (id) => /** @type {HTMLElement} */ (document.getElementById(id));
const TOOL_LOG_MAX = 200; // entries kept in the tool log; older ones are removed

export function promptLabel(prompt) {
  try { if (JSON.parse(prompt).script) return "(scripted run)"; } catch { /* free text */ }
  return prompt;
}

export class Transcript {
  /** @param {import("./client.js").CowriteClient} client */
  constructor(client) {
    this.client = client;
    this.list = $("transcript");
    /** @type {Map<string, HTMLElement>} message_id -> bubble, while its run lasts */ this.bubbles = new Map();
    this.thinking = null;
    this.timing = { submit: 0, first: 0, runId: null, tools: new Map() };
    // Threads (1.1): runs of a thread other than the shown one are folded and dimmed.
    /** @type {() => string} */ this.thread = () => DEFAULT_THREAD;
    this.runThreads = new RunThreads();
    /** @type {Map<string, {box: HTMLDetailsElement, head: HTMLElement, text: HTMLElement}>} */
    this.folds = new Map();
    /** @type {Set<string>} queued runs that have not started (their end is no run's end) */
    this.queued = new Set();
    /** @type {{type: string, detail: any}[]|null} events held back while the history loads */
    this.backlog = null;
    this.loads = 0;
    /** Whether this tab may answer an approval; `answer` reopens its dialog (set by app.js). */
    /** @type {(request: any) => boolean} */ this.mayAnswer = () => false;
    /** @type {(request: any) => void} */ this.answer = () => {};
    /** @type {Map<string, (detail: any) => void>} */ this.handlers = new Map();
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

  /** The user asked for run `runId`: clear the chips and start the clock. */
  startTiming(runId = null) {
    $("timings").textContent = "";
    Object.assign(this.timing, { submit: performance.now(), first: 0, runId });
    this.timing.tools.clear();
  }

  stopTiming() {
    Object.assign(this.timing, { submit: 0, runId: null });
  }

  /**
   * Load the history (`fetchMessages`) and draw it, then the events that came
   * meanwhile. `fresh` (a welcome that did not resume) forgets events held back for
   * an earlier load; a load that a newer one overtook draws nothing. `activeRunId`:
   * the run active at the welcome, which folds when its prompt is not in the history.
   */
  async load(fetchMessages, { activeRunId = null, fresh = false, threads = false } = {}) {
    const load = ++this.loads;
    if (fresh || this.backlog === null) this.backlog = [];
    let messages;
    try {
      messages = await fetchMessages();
    } catch (error) {
      if (load !== this.loads) return;
      this.#replay(null);
      this.notice(`could not load the history: ${error.message ?? error}`, true);
      return;
    }
    if (load !== this.loads) return; // a newer load draws the transcript
    this.rebuild(messages);
    if (activeRunId && threads && !messages.some((m) => m.run_id === activeRunId)) {
      this.runThreads.markOther(activeRunId);
    }
    this.#replay(messages);
  }

  /** Draw the history: the transcript of the thread shown. */
  rebuild(messages) {
    this.list.textContent = "";
    this.bubbles.clear();
    this.folds.clear();
    this.thinking = null;
    for (const m of messages) {
      if (m.role === "user") this.add("user", promptLabel(m.content));
      else if (m.role === "assistant") {
        this.add("assistant", m.content + (m.interrupted ? " …(interrupted)" : ""));
      }
    }
  }

  /**
   * A welcome that did not resume: runs other than `active` ended unseen. Their tool
   * calls still waiting are marked lost; `active`'s pending calls are listed.
   */
  forgetLostRuns(active) {
    for (const item of document.querySelectorAll("#tool-log li")) {
      const element = /** @type {HTMLElement} */ (item);
      if (element.dataset.run === active?.run_id || element.querySelector("[class^=status-]")) continue;
      element.querySelector(".answer")?.remove();
      element.querySelector("b")?.remove();
      element.append(Object.assign(document.createElement("b"), {
        className: "status-lost", textContent: " · lost (its run ended unseen)" }));
    }
    this.#unthink();
    this.bubbles.clear();
    for (const item of active?.pending ?? []) {
      const request = { ...item, run_id: active.run_id, user_id: active.user_id };
      if (item.kind === "approval") this.#awaiting(request);
      else this.#toolItem(item.call_id, active.run_id).textContent ||= `${item.name}(…) → client…`;
    }
  }

  #replay(history) {
    const events = this.backlog ?? [];
    this.backlog = null;
    const covered = history ? coveredByHistory(history, events.map((e) => e.detail))
      : { prompts: new Set(), messages: new Set() };
    for (const { type, detail } of events) {
      if (covered.messages.has(detail.message_id)) { this.#unthink(); continue; } // in the history
      if (type === "run.started" && covered.prompts.has(detail.run_id)) {
        this.runThreads.started(detail);
        if (!this.#fold(detail.run_id, detail.prompt)) this.thinking = this.add("assistant thinking", "thinking");
        continue;
      }
      this.handlers.get(type)?.(detail);
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

  /** A message's text inside a fold: one span per message, so a discarded one can go. */
  #foldPart(fold, messageId) {
    let part = [...fold.text.children].find((child) => /** @type {HTMLElement} */ (child).dataset.message === messageId);
    if (!part) {
      part = document.createElement("span");
      /** @type {HTMLElement} */ (part).dataset.message = messageId;
      fold.text.append(part);
    }
    return part;
  }

  #chip(label, ms) {
    const chip = document.createElement("span");
    chip.textContent = `${label} ${ms.toFixed(0)} ms`;
    $("timings").append(chip);
  }

  #unthink() {
    if (this.thinking) { this.thinking.remove(); this.thinking = null; }
  }

  #toolItem(callId, runId) {
    let item = /** @type {HTMLElement|null} */ (document.querySelector(`#tool-log [data-call="${CSS.escape(callId)}"]`));
    if (!item) {
      item = document.createElement("li");
      item.dataset.call = callId;
      $("tool-log").append(item);
      while ($("tool-log").childElementCount > TOOL_LOG_MAX) $("tool-log").firstElementChild?.remove();
    }
    if (runId) item.dataset.run = runId;
    return item;
  }

  /** The tool log's entry of a call waiting for approval; its user may reopen the dialog. */
  #awaiting(request) {
    const item = this.#toolItem(request.call_id, request.run_id);
    item.replaceChildren(request.name, Object.assign(document.createElement("b"), {
      className: "awaiting", textContent: " awaits approval" }));
    if (this.mayAnswer(request)) {
      item.append(Object.assign(document.createElement("button"), {
        type: "button", className: "secondary answer", textContent: "Answer…",
        onclick: () => this.answer(request) }));
    }
  }

  #listen() {
    // `on`: draws the transcript or the tool log, so it waits while the history loads;
    // `now`: bookkeeping that must not wait.
    const on = (type, handler) => {
      this.handlers.set(type, handler);
      this.client.addEventListener(type, ({ detail }) => {
        if (this.backlog) this.backlog.push({ type, detail });
        else handler(detail);
      });
    };
    const now = (type, handler) => this.client.addEventListener(type, ({ detail }) => handler(detail));
    const timed = (runId) => this.timing.submit && runId === this.timing.runId;

    now("welcome", (welcome) => {
      this.queued = new Set((welcome.queued_runs ?? []).map((run) => run.run_id));
    });
    now("run.queued", (queued) => this.queued.add(queued.run_id));
    now("run.started", (run) => {
      this.queued.delete(run.run_id);
      if (timed(run.run_id)) this.#chip("→ run.started", performance.now() - this.timing.submit);
    });
    now("message.delta", (delta) => {
      if (timed(delta.run_id) && !this.timing.first) {
        this.timing.first = performance.now();
        this.#chip("→ first delta", this.timing.first - this.timing.submit);
      }
    });
    now("tool.call", (call) => this.timing.tools.set(call.call_id, performance.now()));
    now("tool.done", (done) => {
      const started = this.timing.tools.get(done.call_id);
      this.timing.tools.delete(done.call_id);
      if (started) this.#chip(`tool ${done.call_id.slice(-4)}`, performance.now() - started);
    });
    now("run.finished", (finished) => {
      if (!timed(finished.run_id)) return;
      this.#chip(finishChip(finished.status), performance.now() - this.timing.submit);
      this.stopTiming();
    });

    on("run.started", (run) => {
      this.runThreads.started(run);
      if (this.#fold(run.run_id, run.prompt)) return;
      this.add("user", promptLabel(run.prompt));
      this.thinking = this.add("assistant thinking", "thinking");
    });

    on("message.delta", (delta) => {
      const fold = this.#fold(delta.run_id);
      if (fold) { this.#foldPart(fold, delta.message_id).textContent += delta.delta; return; }
      let bubble = this.bubbles.get(delta.message_id);
      if (!bubble) {
        this.#unthink();
        bubble = this.add("assistant", "");
        bubble.dataset.run = delta.run_id;
        this.bubbles.set(delta.message_id, bubble);
      }
      bubble.textContent += delta.delta;
      this.list.scrollTop = this.list.scrollHeight;
    });

    on("message.done", (done) => {
      const fold = this.#fold(done.run_id);
      if (fold) { this.#foldPart(fold, done.message_id).textContent = done.text; return; }
      this.#unthink();
      const bubble = this.bubbles.get(done.message_id) ?? this.add("assistant", "");
      bubble.textContent = done.text;
      bubble.dataset.run = done.run_id;
      this.bubbles.set(done.message_id, bubble);
    });

    // PROTOCOL.md section 13: the model call is made again under a new message_id.
    on("message.discarded", (discarded) => {
      const fold = this.folds.get(discarded.run_id);
      if (fold) this.#foldPart(fold, discarded.message_id).remove();
      this.bubbles.get(discarded.message_id)?.remove();
      this.bubbles.delete(discarded.message_id);
    });

    on("tool.call", (call) => {
      this.#unthink();
      // An approved call keeps its "approved by" chip: name(args) · approved by x → client… ok
      const item = this.#toolItem(call.call_id, call.run_id);
      const approval = item.querySelector(".approval");
      item.replaceChildren(`${call.name}(${JSON.stringify(call.arguments).slice(0, 120)})`);
      if (approval) item.append(approval);
      item.append(Object.assign(document.createElement("b"), { textContent: ` → ${call.executor}…` }));
    });

    on("approval.requested", (request) => {
      this.#unthink();
      this.#awaiting(request);
    });

    on("approval.resolved", (resolved) => {
      const item = this.#toolItem(resolved.call_id, resolved.run_id);
      item.querySelector(".answer")?.remove();
      item.querySelector(".awaiting")?.remove();
      item.querySelector(".approval")?.remove();
      item.append(Object.assign(document.createElement("span"), {
        className: `approval decision-${resolved.decision}`,
        textContent: ` · ${approvalChip(resolved.decision, resolved.user_id)}` }));
    });

    on("tool.done", (done) => {
      const item = this.#toolItem(done.call_id, done.run_id);
      item.querySelector(".answer")?.remove();
      item.querySelector("b")?.remove();
      item.append(Object.assign(document.createElement("b"), {
        className: `status-${done.status}`, textContent: ` ${done.status}` }));
    });

    on("run.finished", (finished) => {
      if (this.queued.delete(finished.run_id)) return; // cancelled while queued: it never ran
      const fold = this.#fold(finished.run_id);
      if (fold) fold.head.append(` · ${finished.status}${finished.reason ? ` (${finished.reason})` : ""}`);
      else {
        this.#unthink();
        this.notice(`run ${finished.status}${finished.reason ? ` (${finished.reason})` : ""}` +
          `${finished.error ? `: ${finished.error.message}` : ""} · ${finished.steps} model call(s)`,
          finished.status !== "completed");
      }
      this.folds.delete(finished.run_id);
      for (const [id, bubble] of this.bubbles) if (bubble.dataset.run === finished.run_id) this.bubbles.delete(id);
    });

    on("document.changed", (change) => {
      if (change.client_id !== this.client.clientId && change.origin === "user") {
        this.notice(`${change.user_id} edited the document`);
      }
    });

    on("error", (error) => this.notice(`error ${error.code}: ${error.message}`, true));
  }
}
