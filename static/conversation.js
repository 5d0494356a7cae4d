// The test page's thread switcher and workflows menu (protocol 1.1, section 14),
// the DOM side; the decisions (names, lists, groups) are in threads.js.
//
// Threads: the switcher lists `GET /v1/documents/{id}/threads` plus the current
// thread, and "New thread" adds a named one; the current thread is kept in the
// URL (`?thread=`), so a reload or a shared link opens the same conversation.
// Workflows: the menu lists `GET /v1/workflows` by category; picking one puts it on
// the prompt box, where it stays (every run sent from the box uses it) until cleared.

import { DEFAULT_THREAD, groupWorkflows, threadEntries, threadIdProblem } from "./threads.js";

const $ = (id) => /** @type {any} */ (document.getElementById(id));
const el = (tag, props = {}) => Object.assign(document.createElement(tag), props);

/** An authorised GET of a JSON endpoint; throws with the HTTP status on a refusal. */
async function getJson(path, getToken) {
  const response = await fetch(path, { headers: { authorization: `Bearer ${await getToken()}` } });
  if (!response.ok) throw new Error(`GET ${path.split("?")[0]} answered HTTP ${response.status}`);
  return response.json();
}

export class ThreadSwitcher {
  /**
   * @param {{documentId: string, getToken: () => Promise<string>,
   *   onSwitch: (thread: string) => void}} how
   */
  constructor({ documentId, getToken, onSwitch }) {
    Object.assign(this, { documentId, getToken, onSwitch });
    const asked = new URLSearchParams(location.search).get("thread");
    /** @type {string} */ this.current = asked && !threadIdProblem(asked) ? asked : DEFAULT_THREAD;
    this.known = [];
    this.enabled = false;
    $("thread").addEventListener("change", () => this.switchTo($("thread").value));
    $("new-thread-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const name = $("new-thread").value.trim();
      const problem = threadIdProblem(name);
      $("thread-error").textContent = problem ?? "";
      if (problem) return;
      $("new-thread").value = "";
      this.switchTo(name);
    });
  }

  /** The server announced (or not) `threads`: show the switcher and load the list. */
  enable(on) {
    this.enabled = on;
    $("threads-box").hidden = !on;
    if (!on) this.current = DEFAULT_THREAD;
    if (on) this.refresh();
  }

  /** The thread to send with `run.start`, or undefined for a server without threads. */
  runThread() {
    return this.enabled ? this.current : undefined;
  }

  /** `?thread=` for the history endpoint ("" for a server without threads). */
  historyQuery() {
    return this.enabled ? `?thread=${encodeURIComponent(this.current)}` : "";
  }

  async refresh() {
    if (!this.enabled) return;
    try {
      const body = await getJson(`/v1/documents/${encodeURIComponent(this.documentId)}/threads`,
        this.getToken);
      this.known = body.threads ?? [];
      $("thread-error").textContent = "";
    } catch (error) {
      $("thread-error").textContent = `could not list the threads: ${error.message}`;
    }
    this.render();
  }

  render() {
    $("thread").replaceChildren(...threadEntries(this.known, this.current).map((entry) =>
      el("option", { value: entry.thread_id, textContent: entry.label,
                     selected: entry.thread_id === this.current })));
  }

  switchTo(thread) {
    if (thread === this.current) { this.render(); return; }
    this.current = thread;
    const search = new URLSearchParams(location.search);
    if (thread === DEFAULT_THREAD) search.delete("thread"); else search.set("thread", thread);
    history.replaceState(null, "", `?${search}`);
    this.render();
    this.onSwitch(thread);
  }
}

export class WorkflowMenu {
  /**
   * @param {{getToken: () => Promise<string>, onLoad: (names: string[]) => void,
   *   disabled: boolean}} how
   */
  constructor({ getToken, onLoad, disabled }) {
    Object.assign(this, { getToken, onLoad, disabled });
    /** @type {{name: string, title?: string, mode?: string}|null} */ this.selected = null;
    /** @type {string[]} */ this.names = [];
    $("workflow-clear").addEventListener("click", () => this.pick(null));
  }

  /** Load the menu when the server announces `workflows`; hide it otherwise. */
  async enable(on) {
    $("workflows").hidden = !on;
    if (!on) { this.pick(null); this.names = []; this.onLoad([]); return; }
    let workflows;
    try {
      workflows = (await getJson("/v1/workflows", this.getToken)).workflows ?? [];
    } catch (error) {
      $("workflow-list").replaceChildren(el("p", { className: "menu-empty error",
        textContent: `Could not list the workflows: ${error.message}` }));
      return;
    }
    this.names = workflows.map((w) => w.name);
    this.render(workflows);
    if (this.selected && !this.names.includes(this.selected.name)) this.pick(null);
    this.onLoad(this.names);
  }

  render(workflows) {
    if (workflows.length === 0) {
      $("workflow-list").replaceChildren(el("p", { id: "workflow-empty", className: "menu-empty",
        textContent: "No workflows configured. The operator defines them in the COWRITE_CONFIG " +
          "file ([[workflows]]; see examples/cowrite.toml)." }));
      return;
    }
    $("workflow-list").replaceChildren(...groupWorkflows(workflows).flatMap(({ category, workflows: list }) => [
      el("div", { className: "menu-head", textContent: category }),
      ...list.map((workflow) => {
        const item = el("button", { type: "button", className: "menu-item", disabled: this.disabled });
        item.dataset.workflow = workflow.name;
        item.setAttribute("role", "menuitem");
        item.append(el("b", { textContent: workflow.title || workflow.name }),
          el("span", { textContent: [workflow.description, `${workflow.mode ?? "agent"} mode`]
            .filter(Boolean).join(" · ") }));
        item.addEventListener("click", () => { $("workflows").open = false; this.pick(workflow); });
        return item;
      })]));
  }

  /** Put a workflow on the prompt box (null clears it). */
  pick(workflow) {
    this.selected = workflow;
    $("workflow-chip").hidden = !workflow;
    $("workflow-name").textContent = workflow ? (workflow.title || workflow.name) : "";
    $("workflow-chip").title = workflow ? `run.start.workflow: ${workflow.name}` : "";
    if (workflow) $("prompt").focus();
  }
}
