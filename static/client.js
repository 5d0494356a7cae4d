// cowrite client: a dependency-free ES module for editor frontends.
//
//   import { CowriteClient } from "/static/client.js";
//   const client = new CowriteClient({ baseUrl: "ws://host:8000", documentId: "doc-1",
//                                      getToken: async () => token });
//   client.registerTool({ name: "read_document", parameters: {type: "object"} },
//                       async (args) => ({ text: editor.value }));
//   client.addEventListener("message.delta", (e) => render(e.detail.delta));
//   client.connect();
//   await client.startRun({ prompt: "Tighten the intro" });
//
// It sends `hello`, reconnects with exponential backoff and jitter when the
// close code says so, resumes with {epoch, after_seq} and drops any durable
// event it has already seen, answers `tool.call`s addressed to its client_id
// with the registered handlers (once per call, even across reconnects), and
// emits one DOM event per server event type plus "state" and "event".
// A replayed tool.call runs only once the replay is in, and only if the resumed
// welcome's active_run still lists it (it may have timed out or been cancelled while
// this client was away). Edits reported while the connection is not open are sent
// after the next welcome; every frame is sent as well-formed Unicode (stringifyWellFormed).
//
// The refused-upgrade rule. A browser cannot see why a WebSocket upgrade
// failed: an HTTP 404 (a document id the server rejects), a 403 (an Origin it
// does not allow) and an unreachable server all end as close 1006 before the
// socket ever opened. Retrying a refusal forever helps nobody, so until this
// client has been welcomed once, `refusedLimit` (default 3) such closes in a
// row stop it: state "closed" with `{code: 1006, refused: true, attempts}`.
// Once welcomed, the server is known to accept this document from this page,
// so the same closes mean a restarting server and are retried with backoff.
// `refusedLimit: 0` retries forever; `connect()` starts counting afresh.
//
// Edit-aware runs (protocol 1.1, section 11; the arithmetic is in edits.js).
// `editorChange({changes})` reports what an edit replaced, and `startRun({scope,
// onEdit, ifBusy})` asks for a scoped or queued run. A server that does not list
// `edit_scope` (or `run_queue`) in `welcome.features` would refuse the unknown
// fields, so the client never sends `changes` to it (the edit is still reported,
// and still aborts the run as in 1.0) and refuses `startRun` with those options
// locally (an Error with `code: "unsupported"`). The client also keeps the
// versions and changes it reported while its runs are active, and answers a
// `tool.call` computed on an older document whose run's scope a later user edit
// touched with `tool.result.error {code: "stale"}` instead of running the handler
// (the rule: `isStaleCall`).
//
// Threads and workflows (1.1, section 14): `startRun({threadId, workflow})` sends
// `thread_id` / `workflow`, refused locally the same way when the server does not
// list `threads` / `workflows`.
//
// Size. The server answers a frame larger than `welcome.limits.max_message_bytes`
// with `too_large` and closes 1009, which stops the client for good. So `send`
// measures each frame (UTF-8) first and refuses a larger one locally with an Error
// whose `code` is "too_large" (a rejected promise, or thrown without `expectReply`);
// nothing is sent and the connection stays open. A tool result that large is sent
// as a `too_large` tool error instead.
//
// Heartbeat. A network path that dies silently (no FIN: a laptop asleep, a NAT
// timeout) never closes the socket. Every `heartbeatMs` (default 15 s; 0: off) the
// client sends a protocol `ping`; when its last ping got no answer and nothing at all
// arrived for two intervals and 5 s, it drops the socket and reconnects (resuming).
// The `pong`s of these pings are not dispatched.
//
// Edits the server refuses for a moment. Each editor.change carries an id, and the
// server applies an edit sent again under its id once. One refused `unavailable` (Redis
// away) or `rate_limited` is sent again, as it was, after the error's `retry_after_ms`,
// the wait doubling while the refusals go on (at most 30 s), for as long as the client
// lives: an edit given up would leave a run writing over what the person typed, the
// server never told. One editor.change is in flight at most, and the edits after a
// refused one wait for it (merged per origin), so none overtakes it; after a reconnect
// it goes first. The app can show it: "edits.pending" {count, code, attempts, retryInMs,
// since} at each refusal, "edits.delivered" {since, ms, dropped} once every edit held
// since then was answered, and "edit.dropped" {message, code, error} for an edit refused
// for good (invalid_message, forbidden...), which is dropped and the next one sent.

/**
 * @typedef {{name: string, description?: string, parameters?: object, requires_approval?: boolean}} ToolSpec
 * @typedef {{type: string, seq?: number, ts?: number, run_id?: string, [key: string]: any}} ServerEvent
 * @typedef {{type: "welcome", protocol: number, session_id: string, document_id: string,
 *   user_id: string, client_id: string, role: "editor"|"viewer", epoch: string, last_seq: number,
 *   resumed: boolean, resume_failed?: "epoch_changed"|"history_truncated", replayed: number,
 *   active_run?: RunSnapshot, limits: object}} Welcome
 * @typedef {{run_id: string, status: string, mode: "agent"|"chat", user_id: string,
 *   client_id: string, step: number, pending: PendingItem[]}} RunSnapshot
 * @typedef {{kind: "tool"|"approval", call_id: string, name: string, arguments: object,
 *   token?: string, expires_at: number}} PendingItem
 * @typedef {{type: "tool.call", run_id: string, call_id: string, name: string, arguments: object,
 *   executor: "client"|"server", client_id?: string, token?: string, expires_at?: number,
 *   seq: number}} ToolCallEvent
 * @typedef {"idle"|"connecting"|"open"|"reconnecting"|"closed"} ConnectionState
 * @typedef {(args: object, call: ToolCallEvent) => Promise<any>|any} ToolHandler
 */

import { isStaleCall } from "./edits.js";

export { applyChanges, changeOverlaps, diffChange, isStaleCall, shiftRange } from "./edits.js";

/** Edits kept for the stale-call rule while runs are active; the older half goes past this. */
const MAX_EDITS = 2000;

/** Heartbeat: silence for 2 intervals and this long means the path is dead. */
const HEARTBEAT_SLACK_MS = 5000;

/** How many times `cancelRun` sends a cancel the server answered `unavailable`. */
const CANCEL_ATTEMPTS = 10;

/** The longest wait between two sends of an editor.change the server keeps refusing for
 * a moment (`unavailable`, `rate_limited`). There is no limit on the number of sends. */
const EDIT_RETRY_MAX_MS = 30_000;

/** A run's status while it is active or waits in line (an ack's `status`). */
const ACTIVE_STATUSES = new Set(["running", "waiting_tool", "waiting_approval", "queued"]);

const encoder = new TextEncoder();

/**
 * The Error for a frame over `limit` bytes (UTF-8), or null when it fits (or no limit).
 * @param {string} text the frame
 * @param {number|undefined} limit welcome.limits.max_message_bytes
 */
export function frameTooLarge(text, limit) {
  if (typeof limit !== "number" || text.length * 3 <= limit) return null; // a UTF-16 unit is <= 3 bytes
  const size = encoder.encode(text).length;
  if (size <= limit) return null;
  return Object.assign(new Error(`the message is ${size} bytes; the server takes at most ` +
    `${limit} (welcome.limits.max_message_bytes)`), { code: "too_large", size, limit });
}

/** One JSON escape; groups: an escaped high surrogate (and the low one after it), a lone low one. */
const JSON_ESCAPE = /\\(?:u(d[89ab][0-9a-f]{2})(\\ud[c-f][0-9a-f]{2})?|u(d[c-f][0-9a-f]{2})|u[0-9a-f]{4}|[^u])/g;

/**
 * `text` (JSON.stringify's output) with every lone surrogate replaced by U+FFFD, as
 * `String.prototype.toWellFormed` would have it. A string cut at a UTF-16 index can end
 * in half an emoji ("Hi 😀".slice(0, 4)); JSON.stringify writes that half as the escape
 * `\ud83d`, which is not Unicode, and the server refuses the whole frame (invalid_message).
 * Well-formed text, escaped pairs and other escapes are returned as they are.
 * @param {string} text
 */
export function wellFormedJson(text) {
  if (!text.includes("\\ud")) return text;
  return text.replace(JSON_ESCAPE, (escape, high, low, lone) =>
    (high && !low) || lone ? "\\ufffd" : escape);
}

/** A JSON.stringify replacer: each string value made well-formed (engines with `toWellFormed`). */
function wellFormedValue(_key, value) {
  return typeof value === "string" && !value.isWellFormed() ? value.toWellFormed() : value;
}

/**
 * The same JSON value as `wellFormedJson(JSON.stringify(value))` (U+FFFD may be written as
 * the character rather than the escape; `toJSON` and getters run twice when a lone
 * surrogate is found), fast for large frames: where the engine has
 * `String.prototype.toWellFormed` (Node 20, current browsers), a frame holding a lone
 * surrogate is stringified again with its string values made well-formed natively, and
 * only what that leaves (a lone surrogate in a key, or text that merely reads "\\ud...")
 * goes through the escape scan, a callback per escape: ~300 ms for a 4 MiB document of
 * quoted lines ending in half an emoji, ~60 ms this way (Node 20; the plain stringify: 7).
 * @param {unknown} value
 */
export function stringifyWellFormed(value) {
  const text = JSON.stringify(value);
  if (!text.includes("\\ud")) return text;
  return wellFormedJson(typeof "".toWellFormed === "function"
    ? JSON.stringify(value, wellFormedValue) : text);
}

/** Close codes of PROTOCOL.md section 7. */
export const CLOSE = Object.freeze({
  NORMAL: 1000, GOING_AWAY: 1001, ABNORMAL: 1006, TOO_BIG: 1009, INTERNAL: 1011,
  RESTART: 1012, TRY_AGAIN: 1013, UNAUTHENTICATED: 4001, FORBIDDEN: 4003,
  RATE_LIMITED: 4008, SLOW_CONSUMER: 4009, TOO_MANY_INVALID: 4400,
});

/**
 * What to do after a close: "retry" (with backoff, resuming), "reauth" (get a
 * fresh token, then retry), or "stop" (the client must be fixed, or the user
 * may not open the document).
 * @param {number} code
 * @returns {"retry"|"reauth"|"stop"}
 */
export function closeAction(code) {
  switch (code) {
    case CLOSE.UNAUTHENTICATED: return "reauth";
    case CLOSE.NORMAL: case CLOSE.TOO_BIG: case CLOSE.FORBIDDEN: case CLOSE.TOO_MANY_INVALID:
      return "stop";
    default: return "retry"; // 1001, 1005/1006 (network; see upgradeRefused), 1011-1013, 4008, 4009
  }
}

/**
 * The refused-upgrade rule (see the top of this file): true when the client
 * should stop rather than retry after this close.
 * @param {{code: number, opened: boolean, unopened: number, welcomed: boolean, limit: number}} state
 *   `unopened`: closes 1006 in a row, this one included, whose socket never opened.
 * @returns {boolean}
 */
export function upgradeRefused({ code, opened, unopened, welcomed, limit }) {
  return code === CLOSE.ABNORMAL && !opened && !welcomed && limit > 0 && unopened >= limit;
}

/**
 * Exponential backoff with full jitter: a random delay in [0, min(max, base * 2^attempt)].
 * @param {number} attempt 0 for the first retry
 * @param {{baseMs?: number, maxMs?: number, random?: () => number}} [options]
 */
export function backoffDelay(attempt, { baseMs = 250, maxMs = 10_000, random = Math.random } = {}) {
  const ceiling = Math.min(maxMs, baseMs * 2 ** Math.min(attempt, 20));
  return Math.round(random() * ceiling);
}

/**
 * Where this client stands in the document log, and whether an event is new.
 * Durable events arrive in seq order; anything at or below `lastSeq` was seen.
 */
export class SeqTracker {
  constructor() {
    /** @type {string|null} */ this.epoch = null;
    this.lastSeq = 0;
  }

  /** @param {Welcome} welcome */
  onWelcome(welcome) {
    if (!welcome.resumed) this.lastSeq = welcome.last_seq;
    this.epoch = welcome.epoch;
  }

  /** True when `event` is durable and new (and records it); false for a duplicate. */
  accept(event) {
    if (typeof event.seq !== "number") return true;
    if (event.seq <= this.lastSeq) return false;
    this.lastSeq = event.seq;
    return true;
  }

  /** The `hello.resume` to send, or undefined before the first welcome. */
  resumePoint() {
    return this.epoch === null ? undefined : { epoch: this.epoch, after_seq: this.lastSeq };
  }
}

/** A handler's failure as a tool.result error: `code` must be a string (DOMException's is a number). */
function toolError(error) {
  const code = typeof error?.code === "string" ? error.code : error?.name;
  return { message: String(error?.message ?? error), ...(typeof code === "string" ? { code } : {}) };
}

function randomId(prefix) {
  const bytes = new Uint8Array(8);
  globalThis.crypto.getRandomValues(bytes);
  return prefix + Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

export class CowriteClient extends EventTarget {
  /**
   * @param {{baseUrl: string, documentId: string, getToken: () => Promise<string>|string,
   *   clientId?: string, WebSocketImpl?: typeof WebSocket, backoff?: object,
   *   setTimeout?: typeof setTimeout, clearTimeout?: typeof clearTimeout, now?: () => number,
   *   refusedLimit?: number, heartbeatMs?: number}} options
   */
  constructor(options) {
    super();
    this.baseUrl = options.baseUrl.replace(/\/$/, "");
    this.documentId = options.documentId;
    this.getToken = options.getToken;
    this.clientId = options.clientId ?? randomId("tab-");
    this.WebSocketImpl = options.WebSocketImpl ?? globalThis.WebSocket;
    // Both used to fail later, out of reach: connect() returned and the process died on
    // "this.WebSocketImpl is not a constructor", or the client stayed "connecting".
    if (typeof this.WebSocketImpl !== "function") {
      throw new TypeError("no WebSocket here: pass options.WebSocketImpl (Node below 22: " +
                          "the `ws` package's WebSocket)");
    }
    if (!/^[a-z][a-z0-9+.-]*:/i.test(this.baseUrl)) {
      throw new TypeError(`baseUrl must be a ws:// or wss:// URL with no path, e.g. ` +
                          `ws://127.0.0.1:8000 (got ${JSON.stringify(options.baseUrl)})`);
    }
    this.backoff = options.backoff ?? {};
    this.setTimer = options.setTimeout ?? ((fn, ms) => setTimeout(fn, ms));
    // A custom setTimeout's handles mean nothing to the global clearTimeout.
    this.clearTimer = options.clearTimeout ??
      (options.setTimeout ? () => {} : (handle) => clearTimeout(handle));
    /** the clock of the heartbeat and of tool.executed's `ms` */
    this.now = options.now ?? (() => performance.now());
    this.heartbeatMs = options.heartbeatMs ?? 15_000;
    this.seq = new SeqTracker();
    /** @type {ConnectionState} */ this.state = "idle";
    /** @type {Welcome|null} */ this.welcome = null;
    /** @type {Map<string, {spec: ToolSpec, handler: ToolHandler}>} */ this.tools = new Map();
    /** @type {Map<string, object>} results kept until their tool.done, to resend after a drop */
    this.results = new Map();
    /** @type {Set<string>} calls this client started executing */ this.executing = new Set();
    /** @type {Map<string, {resolve: Function, reject: Function}>} */ this.waiting = new Map();
    this.attempt = 0;
    this.refusedLimit = options.refusedLimit ?? 3;
    /** closes 1006 in a row whose socket never opened (the refused-upgrade rule) */
    this.unopened = 0;
    /** welcomed at least once: the server accepts this document from here */
    this.welcomed = false;
    this.ws = null;
    /** bumped by connect() and close(): what an older connection left pending does nothing */
    this.generation = 0;
    this.retryTimer = undefined;
    this.beatTimer = undefined;
    /** when the current socket last received anything (heartbeat) */
    this.heardAt = 0;
    this.beatDue = 0;
    /** when the last heartbeat ping was sent (its pong, ts rounded, is not dispatched) */
    this.pingAt = -Infinity;
    /**
     * After a welcome, until its replay (events up to `upTo`; 0 unless resumed) is in: `held`, the
     * replayed tool.calls addressed to this client (call_id -> event), run then only when
     * `pending` (welcome.active_run's tool calls) still lists them; `run`, this client's
     * active run, whose pending calls not replayed are rebuilt from it.
     * `known`: the runs the welcome lists (active, queued), for `unsettledRuns`.
     * @type {{run: RunSnapshot|null, pending: Set<string>, known: Set<string|undefined>,
     *   upTo: number, held: Map<string, ToolCallEvent>}|null}
     */
    this.afterReplay = null;
    this.counter = 0;
    /** the latest document version reported with editorChange (or set by the app) */
    this.documentVersion = undefined;
    /** @type {import("./edits.js").EditRecord[]} edits reported, for the stale-call rule */
    this.edits = [];
    /** versions at or below this were forgotten (MAX_EDITS); null: nothing forgotten */
    this.editsFloor = null;
    /** @type {Map<string, {scope: import("./edits.js").ScopeRange[]|null, version: unknown}>} */
    this.runScopes = new Map();
    /** editorChange calls made while the connection was not open, sent after the next
     * welcome, or while an editor.change is unanswered (one is in flight at most) or an edit
     * refused for a moment waits (`refusedEdits`), sent after its answer */
    this.unsentEdits = [];
    /** editor.change ids: an id names one edit (the server applies an edit sent again
     * under its id once), so this client's are its own prefix and a counter */
    this.editIds = { prefix: randomId("e"), next: 0 };
    /** @type {Map<string, object>} editor.changes sent on this connection and not answered */
    this.editsSent = new Map();
    /**
     * editor.changes the server refused for a moment (`unavailable`: Redis away;
     * `rate_limited`), in order, and one unanswered when the connection dropped. The first
     * is sent again, the same message under the same id, after the refusal's
     * `retry_after_ms` (growing while refusals repeat: `#retryEdit`), as often as it takes;
     * the others, and every edit made meanwhile (in `unsentEdits`), wait until it is
     * accepted (or refused for good), so no later edit overtakes it. `attempts`: sends.
     * @type {{message: object, attempts: number}[]}
     */
    this.refusedEdits = [];
    /** bumped by each retry scheduled and each welcome: an older retry timer does nothing */
    this.editRetry = 0;
    /** since an `edits.pending` until its `edits.delivered`: when the first refusal came
     * (this.now()), and how many edits were refused for good meanwhile
     * @type {{since: number, dropped: number}|null} */
    this.editsHeld = null;
    /**
     * Runs whose run.start was sent but whose answer was lost with the connection: the run
     * may be going (its scope is kept), or may never have reached the server. The next
     * welcome (once its replay is in) settles them.
     * @type {Set<string>}
     */
    this.unsettledRuns = new Set();
    /** the last runs whose run.finished arrived (for `cancelRun`'s retries) */
    this.finishedRuns = new Set();
  }

  /** True when the server announced this protocol 1.1 feature in `welcome.features`. */
  supports(feature) {
    return Boolean(this.welcome?.features?.includes(feature));
  }

  /** @param {ToolSpec} spec @param {ToolHandler} handler */
  registerTool(spec, handler) {
    this.tools.set(spec.name, { spec, handler });
  }

  /** The declared tools, as sent in run.start. @returns {ToolSpec[]} */
  toolSpecs() {
    return [...this.tools.values()].map(({ spec }) => spec);
  }

  /** Open the connection; does nothing while it is open or on its way (connecting, reconnecting). */
  connect() {
    if (this.state !== "idle" && this.state !== "closed") return;
    this.unopened = 0;
    const generation = ++this.generation;
    this.#setState(this.state === "idle" ? "connecting" : "reconnecting");
    this.#open(generation);
  }

  /** Close for good (no reconnect); pending requests reject with "connection closed". */
  close() {
    this.generation += 1; // a getToken, socket or timer of the old connection now does nothing
    this.clearTimer(this.retryTimer);
    const ws = this.ws;
    if (ws) {
      this.#detach();
      ws.close(CLOSE.NORMAL);
    }
    if (this.state !== "closed") this.#setState("closed");
  }

  /** Send a message; with `expectReply`, resolve with its ack or reject with its error. */
  send(message, expectReply = false) {
    if (!this.ws || this.ws.readyState !== 1) {
      return expectReply
        ? Promise.reject(Object.assign(new Error("not connected"), { code: "not_connected" }))
        : undefined;
    }
    const id = expectReply ? message.id ?? `m${++this.counter}` : undefined;
    const text = stringifyWellFormed(expectReply ? { ...message, id } : message);
    const tooLarge = frameTooLarge(text, this.welcome?.limits?.max_message_bytes);
    if (tooLarge && expectReply) return Promise.reject(tooLarge);
    if (tooLarge) throw tooLarge; // sent, it would close the connection for good (1009)
    if (!expectReply) {
      this.ws.send(text);
      return undefined;
    }
    const promise = new Promise((resolve, reject) => this.waiting.set(id, { resolve, reject }));
    this.ws.send(text);
    return promise;
  }

  /**
   * Start a run with this client's tools; resolves with the ack ({run_id, status}).
   * `scope` (-> context.scope, needs `edit_scope`): the ranges the run works on, in
   * the document as `context.document` has it (or as of the last editorChange);
   * `onEdit` (-> options.on_edit, needs `edit_scope`); `ifBusy` (-> options.if_busy,
   * needs `run_queue`). Without those features the promise rejects with `code:
   * "unsupported"` and nothing is sent.
   * @param {{prompt: string, mode?: "agent"|"chat", context?: object, options?: object,
   *   runId?: string, tools?: ToolSpec[], scope?: {from: number, to: number}[],
   *   onEdit?: "abort"|"overlap"|"continue", ifBusy?: "reject"|"enqueue"|"interrupt"}} run
   */
  startRun({ prompt, mode = "agent", context, options, runId, tools, scope, onEdit, ifBusy,
             threadId, workflow }) {
    const needs = [
      [scope !== undefined || onEdit !== undefined, "edit_scope"], [ifBusy !== undefined, "run_queue"],
      [threadId !== undefined, "threads"], [workflow !== undefined, "workflows"]];
    const missing = needs.find(([asked, feature]) => asked && !this.supports(feature))?.[1] ?? null;
    if (missing && this.ws?.readyState === 1) {
      return Promise.reject(Object.assign(
        new Error(`the server does not support ${missing} (welcome.features)`),
        { code: "unsupported" }));
    }
    const id = runId ?? randomId("run_");
    const fullContext = scope === undefined ? context : { ...context, scope };
    const fullOptions = onEdit === undefined && ifBusy === undefined ? options
      : { ...options, ...(onEdit === undefined ? {} : { on_edit: onEdit }),
          ...(ifBusy === undefined ? {} : { if_busy: ifBusy }) };
    this.runScopes.set(id, { scope: fullContext?.scope ?? null,
                             version: fullContext?.document?.version ?? this.documentVersion });
    this.unsettledRuns.delete(id);
    const sent = this.send({ type: "run.start", run_id: id, mode, prompt, context: fullContext,
                             options: fullOptions, tools: tools ?? this.toolSpecs(),
                             thread_id: threadId, workflow }, true);
    sent.then((ack) => {
      // A retry of a run that has finished meanwhile (its run.finished came first).
      if (ack.duplicate && !ACTIVE_STATUSES.has(ack.status)) this.#forgetRun(id);
    }, (error) => {
      // Sent, and the connection closed before the answer: the run may be going (retry
      // with this runId after the next open state). Otherwise the server refused it, or
      // nothing was sent: no run to protect.
      if (error?.code === "connection_closed") this.unsettledRuns.add(id);
      else this.#forgetRun(id);
    });
    return sent;
  }

  /**
   * Cancel a run. A cancel answered `unavailable` (Redis down while the run ends: the
   * server keeps trying to log the end) is sent again after `retry_after_ms`, up to
   * `CANCEL_ATTEMPTS` times; it resolves with `undefined` (no ack) if the run's
   * run.finished came meanwhile, and otherwise settles with the last answer
   * (`run_not_active`: the run has ended).
   */
  cancelRun(runId, reason) {
    const attempt = (left) => this.send({ type: "run.cancel", run_id: runId, reason }, true)
      .catch((error) => {
        if (error?.event?.code !== "unavailable" || left <= 1) throw error;
        if (this.finishedRuns.has(runId)) return undefined;
        return new Promise((resolve) => {
          this.setTimer(resolve, error.event.retry_after_ms ?? 1000);
        }).then(() => (this.finishedRuns.has(runId) ? undefined : attempt(left - 1)));
      });
    return attempt(CANCEL_ATTEMPTS);
  }

  /** @param {{scope?: "call"|"run", arguments?: object}} [how] */
  approve(runId, callId, how = {}) {
    return this.send({ type: "approval", run_id: runId, call_id: callId, decision: "approve",
                       scope: how.scope ?? "call", arguments: how.arguments }, true);
  }

  reject(runId, callId, reason) {
    return this.send({ type: "approval", run_id: runId, call_id: callId, decision: "reject",
                       reason }, true);
  }

  /**
   * Report an edit: origin "user" aborts an active run (unless its `on_edit` says
   * otherwise), "agent" (tool edits) never does. `changes` ([{from, to, insert}], see
   * diffChange) are sent only to a server that supports `edit_scope`; they are kept
   * either way, with `documentVersion`, for the stale-call rule.
   * Each editor.change carries an `id`. One the server refuses for a moment
   * (`unavailable`, `rate_limited`) is sent again as it was after `retry_after_ms` (doubled
   * while refusals repeat, at most 30 s), until it is accepted, never given up, and the
   * edits after it wait for it (see `refusedEdits`); the server applies an edit sent again
   * under its id once. The app is told: "edits.pending" at each such refusal,
   * "edits.delivered" once nothing waits any more, "edit.dropped" for an edit refused for
   * good (any other error code). One editor.change is in flight at most: edits made before
   * its answer wait, so none overtakes a refused one; one unanswered when the connection
   * drops is sent again, first, after the next welcome.
   * Returns true when the connection is open (the edit is sent, or sent after the refused
   * one it waits for); false when it is not: the edit is then kept and sent after the next
   * welcome. Edits that wait go as one message per run of consecutive edits of an origin.
   */
  editorChange({ origin = "user", documentVersion, summary, changes } = {}) {
    this.#record({ version: documentVersion, origin, changes: changes ?? null });
    const edit = { origin, documentVersion, summary, changes };
    const open = this.state === "open" && this.ws?.readyState === 1;
    if (!open || this.refusedEdits.length || this.editsSent.size) { // one in flight at most
      const last = this.unsentEdits.at(-1);
      if (last?.origin === origin) { // changes apply in order: one message holds them all
        last.changes = last.changes && changes && [...last.changes, ...changes];
        last.documentVersion = documentVersion;
        last.summary = summary ?? last.summary;
      } else {
        this.unsentEdits.push({ ...edit, changes: changes && [...changes] });
      }
      return open;
    }
    this.#sendEdit(edit);
    return true;
  }

  refreshAuth(token) {
    return this.send({ type: "auth.refresh", token }, true);
  }

  // -- internals ---------------------------------------------------------------
  #sendEdit({ origin, documentVersion, summary, changes }) {
    const id = `${this.editIds.prefix}.${++this.editIds.next}`;
    const message = { type: "editor.change", id, origin, document_version: documentVersion,
                      summary };
    const withChanges = changes !== undefined && this.supports("edit_scope");
    let sent = withChanges ? { ...message, changes } : message;
    try {
      this.send(sent);
    } catch (error) { // too_large: so many changes; without them, it touches everything
      if (!withChanges) throw error;
      this.send(sent = message);
    }
    this.editsSent.set(id, sent);
  }

  /** The edits kept while the connection was away or an edit was refused, in order. One
   * too large even without its changes (a huge summary) goes without the summary: a throw
   * here would leave the client welcomed yet never open, the rest unsent. */
  #sendUnsentEdits() {
    const dropped = [];
    while (this.unsentEdits.length && !this.editsSent.size) { // the next goes on its answer
      const edit = this.unsentEdits.shift();
      try {
        this.#sendEdit(edit);
      } catch {
        try {
          this.#sendEdit({ ...edit, summary: undefined, changes: undefined });
        } catch (error) { // a huge document_version: never sendable
          dropped.push({ message: { type: "editor.change", origin: edit.origin,
                                    document_version: edit.documentVersion }, error });
        }
      }
    }
    // Told after the loop: a listener's editorChange must not overtake the edits still kept.
    for (const { message, error } of dropped) this.#editDropped(message, error?.code, error);
  }

  /** The answer to one of our editor.changes (see `refusedEdits`). Refused for a moment:
   * sent again later, however many times (an edit given up would leave the run going on
   * as if the person had not typed); refused for good: dropped, reported, the next goes. */
  #editAnswered(event) {
    const message = this.editsSent.get(event.reply_to);
    this.editsSent.delete(event.reply_to);
    const forAMoment = event.type === "error" &&
      (event.code === "unavailable" || event.code === "rate_limited");
    const first = this.refusedEdits[0];
    if (forAMoment) {
      if (first?.message !== message) this.refusedEdits.push({ message, attempts: 1 });
      const head = this.refusedEdits[0];
      if (head.message !== message) return; // waits behind the first refused one
      const delay = this.#retryEdit(event.retry_after_ms, head.attempts);
      this.editsHeld ??= { since: this.now(), dropped: 0 };
      this.dispatchEvent(new CustomEvent("edits.pending", { detail: {
        count: this.refusedEdits.length + this.unsentEdits.length, code: event.code,
        attempts: head.attempts, retryInMs: delay, since: this.editsHeld.since } }));
      return;
    }
    if (first?.message === message) { // accepted at last, or refused for good: the next goes
      this.refusedEdits.shift();
      if (this.refusedEdits.length) this.#sendRefusedEdit(); // refused too: its wait is over
    }
    if (!this.refusedEdits.length) this.#sendUnsentEdits(); // answered: the next may go
    if (event.type === "error") this.#editDropped(message, event.code, event);
    this.#editsSettled();
  }

  /** An edit refused for good (invalid_message, forbidden...; too_large locally): the
   * server will never have it, so the app is told (`edit.dropped`). */
  #editDropped(message, code, error) {
    if (this.editsHeld) this.editsHeld.dropped += 1;
    this.dispatchEvent(new CustomEvent("edit.dropped", { detail: { message, code, error } }));
  }

  /** After an `edits.pending`: nothing held or in flight any more, `edits.delivered`. */
  #editsSettled() {
    if (!this.editsHeld || this.refusedEdits.length || this.unsentEdits.length ||
        this.editsSent.size) return;
    const { since, dropped } = this.editsHeld;
    this.editsHeld = null;
    this.dispatchEvent(new CustomEvent("edits.delivered", {
      detail: { since, ms: this.now() - since, dropped } }));
  }

  /** Send the first refused edit again after the server's `retry_after_ms` (1 s if none),
   * doubled for each refusal after the first, at most EDIT_RETRY_MAX_MS (never less than
   * the server asked), so a long outage costs one frame every 30 s. Returns the wait. */
  #retryEdit(retryAfterMs, refusals) {
    const asked = retryAfterMs ?? 1000;
    const delay = Math.max(asked, Math.min(EDIT_RETRY_MAX_MS,
                                           asked * 2 ** Math.min(refusals - 1, 20)));
    const retry = ++this.editRetry;
    this.setTimer(() => {
      // Not open: the next welcome sends it (a frame before that would close the socket).
      if (retry === this.editRetry && this.state === "open") this.#sendRefusedEdit();
    }, delay);
    return delay;
  }

  /** The first refused edit, again: the same message, under the same id. */
  #sendRefusedEdit() {
    const first = this.refusedEdits[0];
    if (!first || this.ws?.readyState !== 1) return;
    first.attempts += 1;
    this.editsSent.set(first.message.id, first.message);
    this.send(first.message);
  }

  #record(edit) {
    if (edit.version !== undefined) this.documentVersion = edit.version;
    if (this.runScopes.size === 0) return; // no run of ours to protect: keep nothing
    this.edits.push(edit);
    if (this.edits.length > MAX_EDITS) {
      const dropped = this.edits.splice(0, MAX_EDITS / 2);
      const last = dropped.at(-1)?.version;
      if (typeof last === "number") this.editsFloor = last;
    }
  }

  /** The stale-call rule for one of our calls (see isStaleCall in edits.js). */
  #isStale(call) {
    const known = this.runScopes.get(call.run_id) ?? { scope: null, version: undefined };
    const since = typeof known.version === "number"
      ? Math.min(known.version, Number(call.document_version)) : call.document_version;
    const complete = this.editsFloor === null || (typeof since === "number" && since >= this.editsFloor);
    return isStaleCall({ callVersion: call.document_version, currentVersion: this.documentVersion,
                         scope: known.scope, scopeVersion: known.version, edits: this.edits,
                         complete });
  }

  #trackRun(event) {
    if (event.type === "run.scope") {
      this.runScopes.set(event.run_id, { scope: event.scope ?? null, version: event.document_version });
    } else if (event.type === "run.finished") {
      this.finishedRuns.add(event.run_id);
      if (this.finishedRuns.size > 64) this.finishedRuns.delete(this.finishedRuns.values().next().value);
      this.#forgetRun(event.run_id);
    }
  }

  /** The run is over (or never was): its scope goes; with no run left, the edits too. */
  #forgetRun(runId) {
    this.unsettledRuns.delete(runId);
    if (this.runScopes.delete(runId) && this.runScopes.size === 0) {
      this.edits = [];
      this.editsFloor = null;
    }
  }

  /** A welcome that did not resume: runs other than `active` are gone, with their calls. */
  #forgetLostRuns(active) {
    const pending = new Set((active?.pending ?? []).map((item) => item.call_id));
    for (const runId of this.runScopes.keys()) {
      if (runId !== active?.run_id) this.runScopes.delete(runId);
    }
    this.unsettledRuns.clear();
    for (const callId of this.results.keys()) if (!pending.has(callId)) this.results.delete(callId);
    for (const callId of this.executing) if (!pending.has(callId)) this.executing.delete(callId);
    if (this.runScopes.size === 0) {
      this.edits = [];
      this.editsFloor = null;
    }
  }

  #setState(state, detail = {}) {
    this.state = state;
    this.dispatchEvent(new CustomEvent("state", { detail: { state, ...detail } }));
  }

  async #open(generation) {
    let token;
    try {
      token = await this.getToken();
    } catch (error) {
      if (generation === this.generation) {
        this.#scheduleReconnect({ code: CLOSE.ABNORMAL, reason: String(error) });
      }
      return;
    }
    if (generation !== this.generation) return; // close() (and maybe connect()) came meanwhile
    const url = `${this.baseUrl}/v1/documents/${encodeURIComponent(this.documentId)}/ws`;
    let ws;
    try {
      ws = new this.WebSocketImpl(url, ["cowrite.v1"]);
    } catch (error) { // a URL the WebSocket refuses (a scheme it does not take): no retry helps
      this.#setState("closed", { code: CLOSE.ABNORMAL, invalidUrl: true,
        reason: `cannot open ${url}: ${error?.message ?? error}` });
      return;
    }
    this.ws = ws;
    let opened = false;
    // Every handler first checks that `ws` is still the client's socket: events of a
    // socket that was closed or replaced are not this connection's.
    ws.onopen = () => {
      if (this.ws !== ws) return;
      opened = true;
      this.heardAt = this.now();
      this.pingAt = -Infinity;
      ws.send(JSON.stringify({ type: "hello", protocol: 1, client_id: this.clientId, token,
                               resume: this.seq.resumePoint() }));
      if (this.heartbeatMs > 0) this.#nextBeat(ws, this.heardAt, this.heartbeatMs);
    };
    ws.onmessage = (message) => {
      if (this.ws !== ws) return;
      this.heardAt = this.now();
      this.#receive(JSON.parse(message.data));
    };
    // An error before open is a failed connection (Node's WebSocket sends no close for a
    // refused upgrade); after open, a close follows. The `ws` package throws without a handler.
    ws.onerror = () => {
      if (!opened) this.#lost(ws, false, { code: CLOSE.ABNORMAL, reason: "the connection failed" });
    };
    ws.onclose = (close) => this.#lost(ws, opened, close);
  }

  /** The socket is gone: forget it, reject the requests waiting on it. */
  #detach() {
    this.ws = null;
    this.clearTimer(this.beatTimer);
    this.afterReplay = null;
    for (const { reject } of this.waiting.values()) {
      reject(Object.assign(new Error("connection closed"), { code: "connection_closed" }));
    }
    this.waiting.clear();
    // Their answers never come. The one in flight is sent again after the next welcome,
    // first, under its id (the server applies an edit once); a refused one stays first.
    for (const message of this.editsSent.values()) {
      if (this.refusedEdits[0]?.message !== message) this.refusedEdits.push({ message, attempts: 0 });
    }
    this.editsSent.clear();
  }

  /** `ws` closed (or failed, or went silent): reconnect, or stop, as the close says. */
  #lost(ws, opened, close) {
    if (this.ws !== ws) return; // an older socket, or already handled (an error, then its close)
    this.#detach();
    this.unopened = !opened && close.code === CLOSE.ABNORMAL ? this.unopened + 1 : 0;
    if (upgradeRefused({ code: close.code, opened, unopened: this.unopened,
                         welcomed: this.welcomed, limit: this.refusedLimit })) {
      this.#setState("closed", { code: close.code, refused: true, attempts: this.unopened,
        reason: "the server refused the WebSocket upgrade (an invalid document id, " +
                "a disallowed Origin) or cannot be reached" });
      return;
    }
    this.#scheduleReconnect(close);
  }

  #scheduleReconnect(close) {
    const action = closeAction(close.code);
    if (action === "stop") {
      this.#setState("closed", { code: close.code, reason: close.reason });
      return;
    }
    const delay = backoffDelay(this.attempt++, this.backoff);
    const generation = this.generation; // read before the listeners: one may close()
    this.#setState("reconnecting", { code: close.code, reason: close.reason, delay, action });
    if (generation !== this.generation) return;
    this.retryTimer = this.setTimer(() => {
      if (generation === this.generation) this.#open(generation);
    }, delay);
  }

  #nextBeat(ws, now, delay) {
    this.beatDue = now + delay;
    this.beatTimer = this.setTimer(() => this.#beat(ws), delay);
  }

  /** The heartbeat of `ws`: a ping every interval; silence for too long: reconnect. */
  #beat(ws) {
    if (this.ws !== ws) return;
    const now = this.now();
    const silent = now - this.heardAt;
    const limit = 2 * this.heartbeatMs + HEARTBEAT_SLACK_MS;
    // A beat that runs late says nothing of the server: the page was paused (a long
    // task, a debugger, an alert()) or its timers throttled (a hidden tab), and the
    // last pong may be queued behind this timer. It only pings again. (Judged late, a
    // 40 s pause dropped a healthy connection 1 ms after the page woke up.)
    const late = now - this.beatDue > HEARTBEAT_SLACK_MS;
    // Dead: an on-time beat finds the last ping unanswered and nothing for `limit`.
    if (!late && this.pingAt > this.heardAt && silent >= limit) {
      this.#lost(ws, true, { code: CLOSE.ABNORMAL,
                             reason: `nothing from the server in ${Math.round(silent)} ms` });
      ws.close(CLOSE.NORMAL); // its close event, whenever it comes, is ignored
      return;
    }
    this.pingAt = now;
    ws.send(JSON.stringify({ type: "ping", ts: Math.round(now) })); // not this.send: apps wrap it
    // The pong gets at least the slack before the ping is judged.
    this.#nextBeat(ws, now, late ? HEARTBEAT_SLACK_MS
      : Math.max(HEARTBEAT_SLACK_MS, Math.min(this.heartbeatMs, limit - silent)));
  }

  #receive(event) {
    if (event.type === "welcome") {
      this.attempt = 0;
      this.welcomed = true;
      this.welcome = event;
      this.seq.onWelcome(event);
      if (!event.resumed) this.#forgetLostRuns(event.active_run);
      // Edits made while away come first: they happened before anything sent from now on;
      // an edit refused for a moment before them first (the others wait for its answer).
      this.editRetry += 1; // its retry timer, if any, is this send
      if (this.refusedEdits.length) this.#sendRefusedEdit();
      else this.#sendUnsentEdits();
      this.#setState("open", { resumed: event.resumed, resumeFailed: event.resume_failed });
      this.#emit(event);
      this.#resumeToolCalls(event);
      return;
    }
    if (event.type === "pong" && event.ts === Math.round(this.pingAt)) return; // the heartbeat's
    if (!this.seq.accept(event)) return; // already seen before a reconnect
    if ((event.type === "ack" || event.type === "error") && event.reply_to) {
      const waiter = this.waiting.get(event.reply_to);
      if (waiter) {
        this.waiting.delete(event.reply_to);
        if (event.type === "ack") waiter.resolve(event);
        else waiter.reject(Object.assign(new Error(event.message), { event }));
      }
      if (this.editsSent.has(event.reply_to)) this.#editAnswered(event);
    }
    if (event.type === "tool.done") {
      this.results.delete(event.call_id);
      this.executing.delete(event.call_id); // done: never called again
      this.afterReplay?.held.delete(event.call_id);
    }
    if (event.type === "run.finished" && this.afterReplay) {
      for (const [callId, call] of this.afterReplay.held) {
        if (call.run_id === event.run_id) this.afterReplay.held.delete(callId);
      }
    }
    if (event.type === "error" && (event.code === "unavailable" || event.code === "rate_limited")) {
      this.#retryResult(event);
    }
    this.#trackRun(event);
    this.#emit(event);
    if (event.type === "tool.call" && event.executor === "client" &&
        event.client_id === this.clientId) {
      // Replayed after a resume: it may have ended (timeout, cancel) while this client was
      // away, which a later replayed event or welcome.active_run says. Held until then.
      if (this.afterReplay && event.seq <= this.afterReplay.upTo) {
        this.afterReplay.held.set(event.call_id, event);
      } else {
        this.#execute(event);
      }
    }
    if (this.afterReplay && typeof event.seq === "number") this.#runRebuiltCalls();
  }

  #emit(event) {
    this.dispatchEvent(new CustomEvent(event.type, { detail: event }));
    this.dispatchEvent(new CustomEvent("event", { detail: event }));
  }

  /** `unavailable` (Redis down, the run changing instances) or `rate_limited` for a kept
   * result: send it again after `retry_after_ms`, unless its tool.done came meanwhile. */
  #retryResult(error) {
    const result = [...this.results.values()].find((r) => r.id === error.reply_to);
    if (!result) return;
    this.setTimer(() => {
      if (this.results.get(result.call_id) === result) this.send(result);
    }, error.retry_after_ms ?? 1000);
  }

  /** After a welcome: resend results the server may have missed; run the calls still
   * pending once the replay (events up to `welcome.last_seq`, after a resume) is in. A
   * replayed tool.call runs then, only if `active_run.pending` still lists it (it may have
   * timed out or been cancelled while this client was away); a pending call that was not
   * replayed is rebuilt from `active_run` (a replayed tool.call is preferred: it carries
   * the document_version the stale-call rule needs, which `active_run.pending` lacks). */
  #resumeToolCalls(welcome) {
    const active = welcome.active_run ?? null;
    const run = active && active.client_id === this.clientId ? active : null;
    for (const item of run?.pending ?? []) {
      const result = item.kind === "tool" && this.results.get(item.call_id);
      if (result) this.send(result);
    }
    const pending = new Set((active?.pending ?? [])
      .filter((item) => item.kind === "tool").map((item) => item.call_id));
    const known = new Set([active?.run_id, ...(welcome.queued_runs ?? []).map((q) => q.run_id)]);
    this.afterReplay = { run, pending, known, upTo: welcome.resumed ? welcome.last_seq : 0,
                         held: new Map() };
    this.#runRebuiltCalls();
  }

  #runRebuiltCalls() {
    const { run, pending, known, upTo, held } = this.afterReplay;
    if (this.seq.lastSeq < upTo) return;
    this.afterReplay = null;
    // A run whose run.start lost its answer, neither active nor queued now (nor finished in
    // the replay, which forgot it): it never reached the server. Unless retried meanwhile.
    for (const runId of this.unsettledRuns) if (!known.has(runId)) this.#forgetRun(runId);
    for (const call of held.values()) {
      if (pending.has(call.call_id)) this.#execute(call);
    }
    for (const item of run?.pending ?? []) {
      if (item.kind !== "tool" || !item.token || this.executing.has(item.call_id) ||
          this.results.has(item.call_id)) continue;
      this.#execute({ type: "tool.call", run_id: run.run_id, call_id: item.call_id,
                      name: item.name, arguments: item.arguments, token: item.token,
                      executor: "client", client_id: this.clientId, seq: -1 });
    }
  }

  async #execute(call) {
    if (this.executing.has(call.call_id)) return; // exactly once per call
    this.executing.add(call.call_id);
    const tool = this.tools.get(call.name);
    const result = { type: "tool.result", id: `result:${call.call_id}`.slice(0, 64),
                     run_id: call.run_id, call_id: call.call_id, token: call.token };
    const started = this.now();
    let output;
    try {
      if (this.#isStale(call)) {
        throw Object.assign(new Error(
          `stale: the document changed in this run's scope since version ${call.document_version} ` +
          `(now ${this.documentVersion}); read it again before editing`), { code: "stale" });
      }
      if (!tool) throw Object.assign(new Error(`no handler for ${call.name}`), { code: "no_handler" });
      output = (await tool.handler(call.arguments, call)) ?? null;
      // A cycle, a BigInt or a function would make send() throw, and no result would go.
      if (JSON.stringify(output) === undefined) throw new TypeError(`a ${typeof output}`);
      result.output = output;
    } catch (error) {
      result.error = output === undefined ? toolError(error) : { code: "invalid_output",
        message: `the tool's output cannot be sent as JSON: ${error?.message ?? error}` };
    }
    if (frameTooLarge(JSON.stringify(result), this.welcome?.limits?.max_message_bytes)) {
      delete result.output;
      result.error = { code: "too_large", message: "the tool's result is larger than the " +
        `server takes (${this.welcome?.limits?.max_message_bytes} bytes)` };
    }
    // Its tool.done came meanwhile (a timeout, a cancel), or a failed resume forgot it:
    // the server would refuse the result (run_not_active, call_not_pending).
    const ended = !this.executing.has(call.call_id);
    if (!ended) this.results.set(call.call_id, result);
    this.dispatchEvent(new CustomEvent("tool.executed", {
      detail: { call, result, ms: this.now() - started, ended } }));
    if (!ended) this.send(result);
  }
}
