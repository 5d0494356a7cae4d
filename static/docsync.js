// The demo's document sync, and only the demo's. cowrite carries the agent
// (runs, tool calls, approvals); it does not carry the document's text. In a
// real editor the text is synced by the editor's own collaboration layer
// (Yjs, Automerge, Lexical's collab, ProseMirror's collab...). The test page
// has a plain textarea, so it keeps the text itself:
//
// - per document in sessionStorage (per tab, survives a reload), when the
//   "keep the text" setting is on, so a reload shows the text the transcript
//   talks about;
// - across the tabs of this browser through a BroadcastChannel per document:
//   every local change is posted, and a tab that opens asks the others for
//   theirs. The newest change wins (wall clock, then tab id): good enough for
//   tabs of one browser, and exactly the problem a CRDT solves for real.

/** @typedef {{text: string, version: number, at: number, tab: string}} Snapshot */

const newer = (a, b) => !b || a.at > b.at || (a.at === b.at && a.tab > b.tab);

export class DocSync {
  /**
   * @param {{documentId: string, tab: string, keep: boolean, onRemote: (s: Snapshot) => void,
   *   storage?: Storage|null, Channel?: typeof BroadcastChannel|null, now?: () => number}} options
   */
  constructor({ documentId, tab, keep, onRemote, storage = globalThis.sessionStorage ?? null,
                Channel = globalThis.BroadcastChannel ?? null, now = () => Date.now() }) {
    this.key = `cowrite.doc.${documentId}`;
    this.tab = tab;
    this.keep = keep;
    this.storage = storage;
    this.onRemote = onRemote;
    this.now = now;
    /** @type {Snapshot|null} */ this.current = null;
    this.channel = Channel ? new Channel(this.key) : null;
    if (this.channel) this.channel.onmessage = ({ data }) => this.#receive(data);
  }

  /** The text kept for this document in this tab, or null. */
  load() {
    if (!this.keep || !this.storage) return null;
    try {
      const saved = JSON.parse(this.storage.getItem(this.key) ?? "null");
      if (saved && typeof saved.text === "string") this.current = saved;
      return this.current;
    } catch {
      return null; // unreadable: start from the default text
    }
  }

  /** Ask the other tabs of this document for their text; newer answers arrive as onRemote. */
  ask() {
    this.channel?.postMessage({ kind: "ask", tab: this.tab });
  }

  /** A local change (the user typed, or a tool of this tab edited): keep it and tell the others. */
  changed(text, version) {
    this.current = { text, version, at: this.now(), tab: this.tab };
    this.#store();
    this.channel?.postMessage({ kind: "text", ...this.current });
  }

  /** Turn keeping on or off; off also forgets what this tab kept. */
  setKeep(keep) {
    this.keep = keep;
    if (!this.storage) return;
    if (keep) this.#store(); else this.storage.removeItem(this.key);
  }

  close() {
    this.channel?.close();
  }

  #store() {
    if (this.keep && this.storage && this.current) {
      this.storage.setItem(this.key, JSON.stringify(this.current));
    }
  }

  #receive(data) {
    if (!data || data.tab === this.tab) return;
    if (data.kind === "ask") {
      if (this.current) this.channel?.postMessage({ kind: "text", ...this.current });
      return;
    }
    if (data.kind !== "text" || typeof data.text !== "string") return;
    const snapshot = { text: data.text, version: Number(data.version) || 0,
                       at: Number(data.at) || 0, tab: String(data.tab) };
    if (!newer(snapshot, this.current)) return;
    this.current = snapshot;
    this.#store();
    this.onRemote(snapshot);
  }
}
