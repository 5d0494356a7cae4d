// Small decisions of the test page, kept free of the DOM so tests/js can run them
// under node: which document ids the server accepts, what the chips say, and
// where each setting comes from.

/** PROTOCOL.md section 1: anything else is refused before the upgrade (HTTP 404). */
export const DOCUMENT_ID_RE = /^[A-Za-z0-9._:-]{1,128}$/;
const ALLOWED = /[A-Za-z0-9._:-]/;

/**
 * Why `id` cannot be a document id, in words a person can act on; null when it can.
 * @param {string} id
 * @returns {string|null}
 */
export function documentIdProblem(id) {
  if (id.length === 0) return "the document id is empty";
  if (id.length > 128) return `the document id is ${id.length} characters long; the limit is 128`;
  const bad = [...new Set([...id].filter((ch) => !ALLOWED.test(ch)))];
  if (bad.length === 0) return null;
  const named = bad.slice(0, 5).map((ch) => (ch === " " ? "a space" : `“${ch}”`));
  return `the document id contains ${named.join(", ")}${bad.length > 5 ? "…" : ""}; ` +
    "use letters, digits and . _ : - only";
}

/** A valid id close to `id` ("my notes" -> "my-notes"), to offer instead. */
export function suggestDocumentId(id) {
  const cleaned = [...id].map((ch) => (ALLOWED.test(ch) ? ch : "-")).join("")
    .replace(/-{2,}/g, "-").replace(/^-|-$/g, "").slice(0, 128);
  return cleaned || "demo";
}

/** The tool log's chip for `approval.resolved`: "approved by alice", "rejected by bob". */
export function approvalChip(decision, userId) {
  const verb = { approve: "approved", reject: "rejected" }[decision] ?? decision;
  return `${verb} by ${userId}`;
}

/**
 * The timing chip for the end of a run the user started: "→ done" only when it
 * completed; otherwise the way it ended, so an aborted run never reads as done.
 * @param {string} status run.finished status
 */
export function finishChip(status) {
  const words = { completed: "done", timed_out: "timed out" };
  return `→ ${words[status] ?? status}`;
}

/**
 * The page's settings. URL parameters win (links and tests set them), then what
 * this browser stored, then the defaults; `user` defaults to a random name.
 * @param {URLSearchParams} params
 * @param {{getItem(key: string): string|null}} stored localStorage or a stand-in
 * @param {() => string} randomUser
 * @returns {{doc: string, user: string, role: "editor"|"viewer", keepText: boolean}}
 */
export function readSettings(params, stored, randomUser) {
  const role = params.get("role") ?? stored.getItem("cowrite.role");
  const keep = params.get("keep") ?? stored.getItem("cowrite.keepText");
  return {
    doc: params.get("doc") ?? "demo",
    user: params.get("user") || stored.getItem("cowrite.user") || randomUser(),
    role: role === "viewer" ? "viewer" : "editor",
    keepText: keep === null ? true : !["0", "false", "off"].includes(keep),
  };
}
