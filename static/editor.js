// The document side of the test page: a textarea, the five editor tools the
// page declares in every run.start, and the demo's text keeping (docsync.js).
// This is the reference integration: an editor frontend declares and executes
// tools like these against its own document model.

import { DocSync } from "./docsync.js";
import { diffChange } from "./edits.js";

const objectOf = (properties, required = []) =>
  ({ type: "object", properties, required, additionalProperties: false });

export class Editor {
  /**
   * @param {{client: import("./client.js").CowriteClient, documentId: string, tab: string,
   *   keepText: boolean, readOnly: boolean, isRunActive: () => boolean,
   *   onRemoteText: (from: string) => void,
   *   onLocalEdit?: (version: number, changes: object[], origin: "user"|"agent") => void}} options
   */
  constructor({ client, documentId, tab, keepText, readOnly, isRunActive, onRemoteText,
                onLocalEdit = () => {} }) {
    this.client = client;
    this.area = /** @type {HTMLTextAreaElement} */ (document.getElementById("editor"));
    this.versionLabel = document.getElementById("doc-version");
    this.version = 0;
    this.area.readOnly = readOnly;
    this.sync = new DocSync({
      documentId, tab, keep: keepText,
      onRemote: (snapshot) => { // another tab changed the text: show it, send nothing
        this.area.value = snapshot.text;
        this.lastText = snapshot.text;
        this.#setVersion(Math.max(this.version, snapshot.version));
        onRemoteText(snapshot.tab);
      },
    });
    const kept = this.sync.load();
    if (kept) {
      this.area.value = kept.text;
      this.#setVersion(kept.version);
    }
    this.sync.ask();
    this.#registerTools();
    this.onLocalEdit = onLocalEdit;
    /** the text as last reported: each edit's change is computed against it */
    this.lastText = this.area.value;

    // Every user edit is reported with what it replaced (`changes`, PROTOCOL.md section
    // 11). During a run at once (it may abort the run); otherwise after a 300 ms pause,
    // with the changes of every keystroke since, in order, each with its own version
    // kept by the client for the stale-call rule.
    let timer = null;
    let pending = [];
    const flush = this.flush = (summary) => {
      clearTimeout(timer);
      if (pending.length === 0) return;
      client.editorChange({ origin: "user", documentVersion: this.version, summary, changes: pending });
      pending = [];
    };
    this.area.addEventListener("input", () => {
      const change = diffChange(this.lastText, this.area.value, this.area.selectionEnd);
      this.lastText = this.area.value;
      this.#setVersion(this.version + 1);
      this.sync.changed(this.area.value, this.version);
      if (change) {
        pending.push(change);
        this.onLocalEdit(this.version, [change], "user");
      }
      if (isRunActive()) flush("typing"); // the user edits during a run: tell the server at once
      else {
        clearTimeout(timer);
        timer = setTimeout(() => flush(undefined), 300);
      }
    });
  }

  /**
   * Report user edits still waiting for the pause, at once. Called before a run
   * starts: the run's context has the text already, and a late report would abort it.
   * @type {(summary?: string) => void}
   */
  flush = () => {};

  get text() {
    return this.area.value;
  }

  #setVersion(version) {
    this.version = version;
    this.versionLabel.textContent = `v${version}`;
  }

  /** An edit made by the agent: reported with origin "agent", which never aborts the run. */
  #agentEdit(text) {
    const change = diffChange(this.lastText, text);
    this.area.value = text;
    this.lastText = text;
    this.#setVersion(this.version + 1);
    this.sync.changed(text, this.version);
    const changes = change ? [change] : [];
    this.onLocalEdit(this.version, changes, "agent");
    this.client.editorChange({ origin: "agent", documentVersion: this.version, changes });
  }

  #registerTools() {
    const area = this.area;
    this.client.registerTool({
      name: "read_document", description: "Read the whole document and its version.",
      parameters: objectOf({}),
    }, () => ({ text: area.value, version: this.version }));

    this.client.registerTool({
      name: "get_selection", description: "The user's current selection (offsets and text).",
      parameters: objectOf({}),
    }, () => ({ start: area.selectionStart, end: area.selectionEnd,
                text: area.value.slice(area.selectionStart, area.selectionEnd) }));

    this.client.registerTool({
      name: "insert_text", description: "Insert text at the start, the end or the cursor.",
      parameters: objectOf({ text: { type: "string" },
                             position: { enum: ["start", "end", "cursor"] } }, ["text"]),
    }, ({ text, position = "end" }) => {
      const at = position === "start" ? 0 : position === "cursor" ? area.selectionStart
        : area.value.length;
      this.#agentEdit(area.value.slice(0, at) + text + area.value.slice(at));
      return { inserted: text.length, at, version: this.version };
    });

    this.client.registerTool({
      name: "replace_text", description: "Find text and replace it (all occurrences if all=true).",
      parameters: objectOf({ find: { type: "string", minLength: 1 }, replace: { type: "string" },
                             all: { type: "boolean" } }, ["find", "replace"]),
    }, ({ find, replace, all = false }) => {
      const count = area.value.split(find).length - 1;
      if (count === 0) {
        throw Object.assign(new Error(`"${find}" is not in the document`), { code: "not_found" });
      }
      this.#agentEdit(all ? area.value.split(find).join(replace) : area.value.replace(find, replace));
      return { replacements: all ? count : 1, version: this.version };
    });

    this.client.registerTool({
      name: "replace_document", description: "Replace the whole document.",
      requires_approval: true, parameters: objectOf({ text: { type: "string" } }, ["text"]),
    }, ({ text }) => { this.#agentEdit(text); return { length: text.length, version: this.version }; });
  }
}
