// The test page's client id, free of the DOM (tests/js runs it under node). It is
// kept in sessionStorage, so a reload keeps it; but a browser's "Duplicate tab" copies
// sessionStorage too, and two tabs with one client_id would both run every tool call
// addressed to it. So a tab that found an id asks the other tabs of this browser over
// a BroadcastChannel whether one of them uses it; if one answers within `waitMs`, it
// takes a new id. Every tab keeps answering for its id afterwards.

const KEY = "cowrite.clientId";
const CHANNEL = "cowrite.tabs";

/**
 * @param {{storage: {getItem(k: string): string|null, setItem(k: string, v: string): void},
 *   makeId: () => string, Channel?: typeof BroadcastChannel|null, waitMs?: number}} how
 * @returns {Promise<string>} this tab's id, stored
 */
export async function claimTabId({ storage, makeId, Channel = globalThis.BroadcastChannel ?? null,
                                   waitMs = 150 }) {
  let id = storage.getItem(KEY);
  const channel = Channel ? new Channel(CHANNEL) : null;
  if (id && channel && await answered(channel, id, waitMs)) id = null; // a duplicated tab
  if (!id) {
    id = makeId();
    storage.setItem(KEY, id);
  }
  if (channel) {
    const mine = id;
    channel.onmessage = ({ data }) => {
      if (data?.kind === "who-has" && data.id === mine) channel.postMessage({ kind: "mine", id: mine });
    };
  }
  return id;
}

/** True when another tab says, within `waitMs`, that it uses `id`. */
function answered(channel, id, waitMs) {
  return new Promise((resolve) => {
    const timer = setTimeout(() => resolve(false), waitMs);
    channel.onmessage = ({ data }) => {
      if (data?.kind === "mine" && data.id === id) { clearTimeout(timer); resolve(true); }
    };
    channel.postMessage({ kind: "who-has", id });
  });
}
