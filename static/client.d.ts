/**
 * Type declarations of static/client.js, the dependency-free cowrite client.
 *
 * Hand-written: keep them in step with client.js. The message and event types
 * come from protocol.d.ts, which is GENERATED from protocol/schema.json
 * (`make docs`); everything in it is re-exported here, so one import is enough:
 *
 *   import { CowriteClient, type ServerEvent } from "@cowrite/client";
 *
 * Guide: docs/client.md. Wire reference: docs/protocol.md.
 */
import type {
  AckEvent,
  ClientMessage,
  EditorChangeMessage,
  ErrorEvent,
  ResumePoint,
  RunContext,
  RunOptions,
  ServerEvent,
  ToolCallEvent,
  ToolResultMessage,
  ToolSpec,
  WelcomeEvent,
} from "./protocol.js";

export * from "./protocol.js";

/** Every `type` a server event can have. */
export type ServerEventType = ServerEvent["type"];

/** The event type whose `type` is `T`, e.g. `EventOfType<"tool.call">`. */
export type EventOfType<T extends ServerEventType> = Extract<ServerEvent, { type: T }>;

/** Events written to the document log: they carry `seq` and `ts` and are replayed on resume. */
export type DurableEvent = Extract<ServerEvent, { seq: number }>;

/** Close codes of docs/protocol.md ("Close codes"), plus the browser's 1006 and 1012/1013. */
export declare const CLOSE: {
  readonly NORMAL: 1000;
  readonly GOING_AWAY: 1001;
  readonly ABNORMAL: 1006;
  readonly TOO_BIG: 1009;
  readonly INTERNAL: 1011;
  readonly RESTART: 1012;
  readonly TRY_AGAIN: 1013;
  readonly UNAUTHENTICATED: 4001;
  readonly FORBIDDEN: 4003;
  readonly RATE_LIMITED: 4008;
  readonly SLOW_CONSUMER: 4009;
  readonly TOO_MANY_INVALID: 4400;
};

/** What the client does after a close. */
export type CloseAction = "retry" | "reauth" | "stop";

/**
 * "retry" (backoff, then resume), "reauth" (new token, then retry) or "stop"
 * (1000, 1009, 4003, 4400: fix the client, or the user may not open the document).
 */
export declare function closeAction(code: number): CloseAction;

/**
 * The refused-upgrade rule: true when the client should stop rather than retry
 * after this close. A browser reports an upgrade the server refused (HTTP 404
 * or 403) as close 1006 before the socket opened, like an unreachable server;
 * until the client was welcomed once, `limit` such closes in a row stop it.
 * `unopened`: closes 1006 in a row, this one included, whose socket never opened.
 */
export declare function upgradeRefused(state: {
  code: number;
  opened: boolean;
  unopened: number;
  welcomed: boolean;
  limit: number;
}): boolean;

export interface BackoffOptions {
  /** First retry's ceiling in ms (default 250); doubles per attempt. */
  baseMs?: number;
  /** Largest ceiling in ms (default 10000). */
  maxMs?: number;
  /** Source of jitter in [0, 1) (default Math.random). */
  random?: () => number;
}

/** Exponential backoff with full jitter: a delay in [0, min(maxMs, baseMs * 2^attempt)]. */
export declare function backoffDelay(attempt: number, options?: BackoffOptions): number;

/**
 * The Error (`code: "too_large"`) for a frame larger than `limit` bytes in UTF-8,
 * or null when it fits or there is no limit; `send` checks every frame with it
 * against `welcome.limits.max_message_bytes`.
 */
export declare function frameTooLarge(text: string, limit: number | undefined):
  (Error & { code: "too_large"; size: number; limit: number }) | null;

/**
 * JSON text (JSON.stringify's output) with each escaped lone surrogate (`\ud83d`: half a
 * character, from a string cut at a UTF-16 index) replaced by `\ufffd`, as
 * `String.prototype.toWellFormed` would; the server refuses a frame holding one. `send`
 * applies it to every frame (through `stringifyWellFormed`).
 */
export declare function wellFormedJson(text: string): string;

/**
 * `JSON.stringify(value)` made well-formed, what `send` writes: the same JSON value as
 * `wellFormedJson(JSON.stringify(value))`. Where the engine has
 * `String.prototype.toWellFormed` a value holding a lone surrogate is stringified a second
 * time with its strings made well-formed natively (U+FFFD written as the character, not
 * the escape; `toJSON` and getters run twice; a 4 MiB frame: ~60 ms instead of ~300 ms).
 */
export declare function stringifyWellFormed(value: unknown): string;

/** A range `[from, to)` of the document in JavaScript string units (`0 <= from <= to`). */
export interface ScopeRange {
  from: number;
  to: number;
}

/**
 * One edit: `[from, to)` of the document before it was replaced by `insert` units
 * (a count, not the text). Several apply in order, each in the previous one's coordinates.
 */
export interface EditChange {
  from: number;
  to: number;
  insert: number;
}

/** An edit the client reported, as the stale-call rule sees it. */
export interface EditRecord {
  /** The document version after the edit. */
  version: number | string | undefined;
  origin: "user" | "agent";
  /** null: the edit did not say what it changed (overlaps everything). */
  changes: EditChange[] | null;
}

/**
 * The single change that turns `before` into `after`, or null when equal. `cursor`
 * (the caret in `after` right after the edit, e.g. a textarea's selectionEnd) places
 * an ambiguous edit ("aa" -> "aaa"); without it the change is placed rightmost.
 * Never splits a surrogate pair.
 */
export declare function diffChange(before: string, after: string, cursor?: number): EditChange | null;

/** True when the change touches a unit of the range; edges and no-ops do not (protocol section 11). */
export declare function changeOverlaps(change: EditChange, range: ScopeRange): boolean;

/** The range after a change that does not overlap it; throws RangeError for one that does. */
export declare function shiftRange(range: ScopeRange, change: EditChange): ScopeRange;

/** The scope after the changes, in order, or null as soon as one overlaps a range. */
export declare function applyChanges(scope: ScopeRange[], changes: EditChange[]): ScopeRange[] | null;

/**
 * The stale-call rule: true when a `tool.call` computed at `callVersion` (older than
 * `currentVersion`) should be refused with `tool.result.error {code: "stale"}` because
 * a user edit after `callVersion` touched the run's scope (known at `scopeVersion`;
 * null = the whole document). See docs/client.md.
 */
export declare function isStaleCall(state: {
  callVersion: unknown;
  currentVersion: unknown;
  scope: ScopeRange[] | null;
  scopeVersion: unknown;
  edits: EditRecord[];
  /** false when the client forgot edits that old: then the call is stale. */
  complete?: boolean;
}): boolean;

/** Where the client stands in the document log, and whether an event is new. */
export declare class SeqTracker {
  /** `welcome.epoch`, or null before the first welcome. */
  epoch: string | null;
  /** The last `seq` seen. */
  lastSeq: number;
  onWelcome(welcome: Pick<WelcomeEvent, "epoch" | "last_seq" | "resumed">): void;
  /** True when `event` is new (ephemeral events always are); false for a duplicate. */
  accept(event: { seq?: number }): boolean;
  /** The `hello.resume` to send, or undefined before the first welcome. */
  resumePoint(): ResumePoint | undefined;
}

export type ConnectionState = "idle" | "connecting" | "open" | "reconnecting" | "closed";

/** `detail` of the "state" event. */
export type StateDetail =
  | { state: "idle" | "connecting" }
  | {
      state: "open";
      /** The server replays what this client missed. */
      resumed: boolean;
      /** Set when a resume was refused: rebuild the UI from `welcome.active_run` and history. */
      resumeFailed?: "epoch_changed" | "history_truncated";
    }
  | {
      /**
       * Sent once per retry, when it is scheduled (the attempt itself sends no state
       * event), and once by `connect()` after `closed` (then without the fields below).
       */
      state: "reconnecting";
      /**
       * Close code that caused the reconnect: 1006 also for a socket that failed before
       * it opened, a `getToken` that threw, and a connection the heartbeat found silent.
       */
      code?: number;
      reason?: string;
      /** Milliseconds until the next attempt. */
      delay?: number;
      action?: "retry" | "reauth";
    }
  | {
      /** Sent once: a second `close()` sends no second event. */
      state: "closed";
      code?: number;
      reason?: string;
      /** The upgrade was refused `attempts` times in a row (see `upgradeRefused`). */
      refused?: boolean;
      attempts?: number;
      /** The WebSocket refused the URL (e.g. a scheme it does not take): not retried. */
      invalidUrl?: boolean;
    };

/**
 * The call a tool handler receives: the `tool.call` event, or, for a call still
 * pending after a reconnect, one rebuilt from `welcome.active_run` (then `seq`
 * is -1 and `ts` is absent).
 */
export type ToolInvocation = Omit<ToolCallEvent, "ts"> & { ts?: number };

/**
 * Runs one client tool call. Its return value (undefined becomes null) is sent
 * as `tool.result.output`; a throw is sent as `tool.result.error` with the
 * error's `message` and `code` (its `name` when `code` is not a string, as a
 * DOMException's is not). An output JSON cannot encode (a cycle, a BigInt, a
 * function) is sent as the error `{code: "invalid_output"}`.
 */
export type ToolHandler<Args = Record<string, unknown>> = (
  args: Args,
  call: ToolInvocation,
) => unknown;

/** `detail` of the "tool.executed" event, after a handler ran and its result was sent. */
export interface ToolExecutedDetail {
  call: ToolInvocation;
  result: ToolResultMessage;
  /** How long the handler took (by the `now` option's clock). */
  ms: number;
  /**
   * True when the call had ended before the handler returned (its `tool.done` came,
   * e.g. a timeout or a cancel, or a failed resume forgot it): the result was
   * neither sent nor kept, as the server would refuse it.
   */
  ended: boolean;
}

/**
 * `detail` of the "edits.pending" event: an `editor.change` was refused for a moment
 * (`unavailable`, `rate_limited`). It is sent again, as it was, in `retryInMs`, however
 * many times it takes; the edits after it wait for it.
 */
export interface EditsPendingDetail {
  /** editor.change messages waiting (the refused one included; consecutive edits of one origin are one). */
  count: number;
  code: "unavailable" | "rate_limited";
  /** How many times the refused edit was sent so far. */
  attempts: number;
  /** The wait before the next send: `retry_after_ms`, doubled while refusals go on, at most 30 s (never less than asked). */
  retryInMs: number;
  /** When the first of these refusals came (the `now` option's clock). */
  since: number;
}

/** `detail` of the "edits.delivered" event: after "edits.pending", every edit held since was answered. */
export interface EditsDeliveredDetail {
  since: number;
  /** How long edits were held (the `now` option's clock). */
  ms: number;
  /** How many of them were refused for good meanwhile (each reported by "edit.dropped"). */
  dropped: number;
}

/** `detail` of the "edit.dropped" event: an edit the server will never have. */
export interface EditDroppedDetail {
  /** The editor.change as sent (without `id` when it could not be sent at all). */
  message: Partial<EditorChangeMessage>;
  /** The server's error code (`invalid_message`, `forbidden`...), or "too_large" (not sendable). */
  code: string | undefined;
  /** The server's `error` event, or the local Error. */
  error: ErrorEvent | Error;
}

/** The DOM events a CowriteClient dispatches, by name. */
export type CowriteEventMap = {
  [E in ServerEvent as E["type"]]: CustomEvent<E>;
} & {
  /** Every server event, after the one named by its type. */
  event: CustomEvent<ServerEvent>;
  state: CustomEvent<StateDetail>;
  "tool.executed": CustomEvent<ToolExecutedDetail>;
  "edits.pending": CustomEvent<EditsPendingDetail>;
  "edits.delivered": CustomEvent<EditsDeliveredDetail>;
  "edit.dropped": CustomEvent<EditDroppedDetail>;
};

export interface CowriteClientOptions {
  /**
   * e.g. "wss://cowrite.example.com" (no trailing path). One without a scheme
   * ("127.0.0.1:8000") throws a TypeError here.
   */
  baseUrl: string;
  documentId: string;
  /** Called before every (re)connect; return a fresh JWT. */
  getToken: () => Promise<string> | string;
  /** Stable per tab across reconnects (default: random per instance). */
  clientId?: string;
  /** Default `globalThis.WebSocket`; with neither (Node below 22) the constructor throws. */
  WebSocketImpl?: typeof WebSocket;
  backoff?: BackoffOptions;
  /** Refused upgrades in a row before giving up (default 3; 0 retries forever). */
  refusedLimit?: number;
  /**
   * Milliseconds between heartbeat `ping`s (default 15000; 0 turns the heartbeat off).
   * When the last ping got no answer and nothing at all arrived for two intervals
   * and 5 s, the client drops the socket and reconnects (resuming); pending
   * requests reject. The heartbeat's `pong`s are not dispatched.
   */
  heartbeatMs?: number;
  /** For tests: the timer of reconnects, result retries and the heartbeat. */
  setTimeout?: (callback: () => void, ms: number) => unknown;
  /**
   * Cancels a `setTimeout` handle (default: the global clearTimeout, or nothing when
   * a custom `setTimeout` is given without it).
   */
  clearTimeout?: (handle: any) => void;
  /** For tests: the clock, in ms, of the heartbeat and `tool.executed`'s `ms` (default performance.now). */
  now?: () => number;
}

export interface StartRunOptions {
  prompt: string;
  mode?: "agent" | "chat";
  context?: RunContext;
  options?: RunOptions;
  /** Default: a random id, so a retry of the same call is not deduplicated; pass one to retry safely. */
  runId?: string;
  /** Default: the tools registered with `registerTool`. */
  tools?: ToolSpec[];
  /**
   * `context.scope` (needs the server feature `edit_scope`): the parts of the document
   * the run works on, in the document of `context.document.version` (or of the last
   * `editorChange`). Absent: the whole document.
   */
  scope?: ScopeRange[];
  /** `options.on_edit` (needs `edit_scope`): what a user edit does to the run. */
  onEdit?: "abort" | "overlap" | "continue";
  /** `options.if_busy` (needs `run_queue`): what to do while another client's run is active. */
  ifBusy?: "reject" | "enqueue" | "interrupt";
  /** `thread_id` (needs `threads`): the conversation the run belongs to. Absent: "main". */
  threadId?: string;
  /** `workflow` (needs `workflows`): an operator-defined workflow's name (`GET /v1/workflows`). */
  workflow?: string;
}

export interface ApproveOptions {
  /** "run" approves this tool for the rest of the run. */
  scope?: "call" | "run";
  /** Approve with these (edited) arguments instead of the model's. */
  arguments?: Record<string, unknown>;
}

export interface EditorChangeOptions {
  /** "user" (default) aborts an active run; "agent" (edits made by tool calls) never does. */
  origin?: "user" | "agent";
  documentVersion?: number | string;
  summary?: string;
  /**
   * What the edit replaced (`diffChange` computes it for a plain text field). Sent
   * only when the server supports `edit_scope`; kept either way for the stale-call rule.
   */
  changes?: EditChange[];
}

/**
 * How the promises of `send(..., true)` and the run helpers reject: with the
 * server's `error` event in `event`, or without it when the connection was not
 * open (`code` "not_connected", nothing sent) or closed before the answer (`code`
 * "connection_closed": the message may have been carried out; retry a run with the
 * same `runId`), or with `code` "too_large" (nothing sent) for a frame over
 * `welcome.limits.max_message_bytes`, or "unsupported".
 */
export type CowriteRequestError = Error & { event?: ErrorEvent; code?: string };

export declare class CowriteClient extends EventTarget {
  constructor(options: CowriteClientOptions);

  readonly baseUrl: string;
  readonly documentId: string;
  readonly clientId: string;
  /** Current connection state; the "state" event reports every change. */
  readonly state: ConnectionState;
  /** The last `welcome`, or null before the first. */
  readonly welcome: WelcomeEvent | null;
  readonly seq: SeqTracker;
  /** The latest `documentVersion` passed to `editorChange`. */
  readonly documentVersion: number | string | undefined;

  /** True when the last `welcome.features` lists this protocol 1.1 feature. */
  supports(feature: string): boolean;
  /** Declare a client tool and the handler that runs its calls. */
  registerTool<Args = Record<string, unknown>>(spec: ToolSpec, handler: ToolHandler<Args>): void;
  /** The registered tools, as sent in `run.start`. */
  toolSpecs(): ToolSpec[];
  /**
   * Open the connection (and keep reconnecting until `close()` or a "stop" close code).
   * Does nothing while the state is `connecting`, `open` or `reconnecting`.
   */
  connect(): void;
  /**
   * Close for good: no reconnect. Pending requests reject at once ("connection
   * closed"), and nothing of the closed connection is dispatched afterwards;
   * `connect()` may open a new one.
   */
  close(): void;

  /**
   * Send and resolve with the `ack` (or reject with the `error`) answering it;
   * an `id` is added when the message has none.
   */
  send(message: ClientMessage, expectReply: true): Promise<AckEvent>;
  /**
   * Send without waiting; dropped silently when the connection is not open. Throws
   * (code "too_large", nothing sent) for a frame over `welcome.limits.max_message_bytes`.
   */
  send(message: ClientMessage, expectReply?: false): undefined;
  send(message: ClientMessage, expectReply: boolean): Promise<AckEvent> | undefined;

  /**
   * Start a run with this client's tools; resolves with the ack (`{run_id, status}`).
   * With `scope`/`onEdit`, `ifBusy`, `threadId` or `workflow` on a server that lacks
   * `edit_scope`, `run_queue`, `threads` or `workflows`, rejects with an Error whose
   * `code` is "unsupported" and sends nothing.
   */
  startRun(run: StartRunOptions): Promise<AckEvent>;
  /** Resolves with `undefined` when the run's run.finished came while a cancel answered
   * `unavailable` waited to be sent again. */
  cancelRun(runId: string, reason?: string): Promise<AckEvent | undefined>;
  approve(runId: string, callId: string, how?: ApproveOptions): Promise<AckEvent>;
  reject(runId: string, callId: string, reason?: string): Promise<AckEvent>;
  /**
   * Report an edit (no promise: the client deals with the answer). True when the
   * connection is open: the edit is sent, or, while an earlier edit the server refused
   * for a moment (`unavailable`, `rate_limited`) waits to be sent again under its `id`
   * (applied once), sent after it. False when the connection is not open: the edit is
   * kept and sent after the next welcome, before anything else.
   */
  editorChange(change?: EditorChangeOptions): boolean;
  /** Replace the connection's token (same user) before it expires. */
  refreshAuth(token: string): Promise<AckEvent>;

  addEventListener<K extends keyof CowriteEventMap>(
    type: K,
    listener: (this: CowriteClient, event: CowriteEventMap[K]) => unknown,
    options?: boolean | AddEventListenerOptions,
  ): void;
  addEventListener(
    type: string,
    listener: EventListenerOrEventListenerObject | null,
    options?: boolean | AddEventListenerOptions,
  ): void;
  removeEventListener<K extends keyof CowriteEventMap>(
    type: K,
    listener: (this: CowriteClient, event: CowriteEventMap[K]) => unknown,
    options?: boolean | EventListenerOptions,
  ): void;
  removeEventListener(
    type: string,
    listener: EventListenerOrEventListenerObject | null,
    options?: boolean | EventListenerOptions,
  ): void;
}
