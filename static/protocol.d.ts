/**
 * cowrite wire protocol v1: every client->server message and server->client event.
 *
 * GENERATED from protocol/schema.json by tests/node/gen-types.mjs: do not edit.
 * Regenerate with `make docs`. Reference: docs/protocol.md.
 */

/**
 * One JSON text frame on a cowrite WebSocket, in either direction.
 */
export type ProtocolFrame = ClientMessage | ServerEvent;
/**
 * Any message a client may send; `type` tells which.
 */
export type ClientMessage =
  | HelloMessage
  | RunStartMessage
  | ToolResultMessage
  | ApprovalMessage
  | AuthRefreshMessage
  | RunCancelMessage
  | EditorChangeMessage
  | PingMessage;
/**
 * Any event the server sends; `type` tells which.
 */
export type ServerEvent =
  | WelcomeEvent
  | AckEvent
  | ErrorEvent
  | PongEvent
  | RunStartedEvent
  | MessageDeltaEvent
  | MessageDoneEvent
  | ToolCallEvent
  | ApprovalRequestedEvent
  | ApprovalResolvedEvent
  | ToolDoneEvent
  | RunFinishedEvent
  | DocumentChangedEvent
  | RunScopeChangedEvent
  | RunQueuedEvent
  | RunResumedEvent
  | MessageDiscardedEvent;
/**
 * One of the error codes (docs/protocol.md, Errors).
 */
export type ErrorCode =
  | "invalid_message"
  | "unknown_type"
  | "not_ready"
  | "forbidden"
  | "document_busy"
  | "run_not_found"
  | "run_not_active"
  | "call_not_pending"
  | "invalid_token"
  | "rate_limited"
  | "too_large"
  | "unavailable"
  | "internal";

/**
 * First message on every connection: authenticates and joins the document session.
 */
export interface HelloMessage {
  /**
   * Echoed as `reply_to` in the `ack` or `error` that answers this message.
   */
  id?: string | null;
  type: "hello";
  /**
   * Protocol version; only 1 exists.
   */
  protocol?: 1;
  /**
   * Stable per browser tab across reconnects: tool calls are addressed to it.
   */
  client_id: string;
  /**
   * The JWT (or send it as `Authorization: Bearer` on the upgrade request).
   */
  token?: string | null;
  /**
   * Replay what was missed since a previous connection.
   */
  resume?: ResumePoint | null;
}
/**
 * Where a reconnecting client left off in the document log.
 */
export interface ResumePoint {
  /**
   * `welcome.epoch` of the previous connection.
   */
  epoch: string;
  /**
   * The last `seq` the client processed; replay starts after it.
   */
  after_seq: number;
}
/**
 * Start an agent run (or a one-call chat) on the document.
 */
export interface RunStartMessage {
  /**
   * Echoed as `reply_to` in the `ack` or `error` that answers this message.
   */
  id?: string | null;
  type: "run.start";
  /**
   * Client-chosen id: a retry with the same id starts nothing and acks the run's status.
   */
  run_id?: string | null;
  /**
   * `agent`: model and tools in a loop; `chat`: one model call, no tools.
   */
  mode?: "agent" | "chat";
  /**
   * The user's request.
   */
  prompt: string;
  /**
   * The document, selection and anything else the model should see.
   */
  context?: RunContext | null;
  /**
   * Client tools (at most 128) this client executes for the run.
   *
   * @maxItems 128
   */
  tools?: ToolSpec[];
  /**
   * Per-run limits and model.
   */
  options?: RunOptions | null;
  /**
   * The conversation thread: the model sees that thread's history only (1.1).
   */
  thread_id?: string;
  /**
   * An operator-defined workflow (`GET /v1/workflows`): its prompt, tool allowlist,
   * approvals and limits apply to the run (1.1).
   */
  workflow?: string | null;
}
/**
 * What the model is told about the editor besides the prompt.
 */
export interface RunContext {
  /**
   * The document (saves the model a `read_document` call).
   */
  document?: DocumentContext | null;
  /**
   * The user's selection, in whatever shape the editor uses.
   */
  selection?: {
    [k: string]: unknown;
  } | null;
  /**
   * Anything else the model should see.
   */
  extra?: {
    [k: string]: unknown;
  } | null;
  /**
   * The parts of the document the run works on (1.1, `on_edit: overlap`); absent: all.
   */
  scope?: ScopeRange[] | null;
}
/**
 * The document as the client sees it when the run starts.
 */
export interface DocumentContext {
  /**
   * The document's content.
   */
  text: string;
  /**
   * The editor's version of this content, if it keeps one.
   */
  version?: number | string | null;
  /**
   * E.g. `markdown`, `html`, `plain`; free text for the model.
   */
  format?: string | null;
}
/**
 * A part of the document, `[from, to)` in the editor's own offsets (1.1).
 */
export interface ScopeRange {
  /**
   * Start offset.
   */
  from: number;
  /**
   * End offset (exclusive); at least `from`.
   */
  to: number;
}
/**
 * A tool the client offers the model; the client that starts the run executes it.
 */
export interface ToolSpec {
  /**
   * 1-64 chars of `[A-Za-z0-9_-]`, unique within the run.
   */
  name: string;
  /**
   * What the tool does, for the model.
   */
  description?: string;
  /**
   * JSON Schema (object) of the arguments; every call is validated against it.
   */
  parameters?: {
    [k: string]: unknown;
  };
  /**
   * Ask the run's user (`approval.requested`) before each call.
   */
  requires_approval?: boolean;
}
/**
 * Per-run options.
 */
export interface RunOptions {
  /**
   * Model calls allowed in this run; can only lower the server's limit.
   */
  max_steps?: number | null;
  /**
   * Model name for this run (default: the server's).
   */
  model?: string | null;
  /**
   * What a user's edit does to the run (1.1): abort it, abort it only when it
   * overlaps `context.scope`, or never.
   */
  on_edit?: "abort" | "overlap" | "continue";
  /**
   * When another client's run is active (1.1): refuse, wait in line, or end it.
   */
  if_busy?: "reject" | "enqueue" | "interrupt";
}
/**
 * The outcome of a client tool call: exactly one of `output` or `error`.
 */
export interface ToolResultMessage {
  /**
   * Echoed as `reply_to` in the `ack` or `error` that answers this message.
   */
  id?: string | null;
  type: "tool.result";
  /**
   * `tool.call.run_id`.
   */
  run_id: string;
  /**
   * `tool.call.call_id`.
   */
  call_id: string;
  /**
   * `tool.call.token`, copied verbatim (single-use, bound to run, call, user and document).
   */
  token: string;
  /**
   * The tool's result, any JSON (null included); the model sees it.
   */
  output?: unknown;
  /**
   * Instead of `output`: the tool failed.
   */
  error?: ToolError | null;
  /**
   * The document's version after the tool ran, if it changed it.
   */
  document_version?: number | string | null;
}
/**
 * A failed client tool call, as told to the model.
 */
export interface ToolError {
  /**
   * What went wrong, for the model.
   */
  message: string;
  /**
   * A short machine-readable code of the client's choosing.
   */
  code?: string | null;
}
/**
 * The run's user answers an `approval.requested`.
 */
export interface ApprovalMessage {
  /**
   * Echoed as `reply_to` in the `ack` or `error` that answers this message.
   */
  id?: string | null;
  type: "approval";
  /**
   * `approval.requested.run_id`.
   */
  run_id: string;
  /**
   * `approval.requested.call_id`.
   */
  call_id: string;
  /**
   * `approve` dispatches the call; `reject` tells the model the user said no.
   */
  decision: "approve" | "reject";
  /**
   * Why, for the model (with `reject`).
   */
  reason?: string | null;
  /**
   * `run` approves this tool for the rest of the run.
   */
  scope?: "call" | "run";
  /**
   * Approve with these edited arguments instead (validated like the model's).
   */
  arguments?: {
    [k: string]: unknown;
  } | null;
}
/**
 * Replace the connection's token before it expires.
 */
export interface AuthRefreshMessage {
  /**
   * Echoed as `reply_to` in the `ack` or `error` that answers this message.
   */
  id?: string | null;
  type: "auth.refresh";
  /**
   * A fresh JWT for the same `sub`.
   */
  token: string;
}
/**
 * The run's user stops the run.
 */
export interface RunCancelMessage {
  /**
   * Echoed as `reply_to` in the `ack` or `error` that answers this message.
   */
  id?: string | null;
  type: "run.cancel";
  /**
   * The run to cancel.
   */
  run_id: string;
  /**
   * Free text, for the logs.
   */
  reason?: string | null;
}
/**
 * The document changed in this editor; broadcast as `document.changed`.
 */
export interface EditorChangeMessage {
  /**
   * Echoed as `reply_to` in the `ack` or `error` that answers this message.
   */
  id?: string | null;
  type: "editor.change";
  /**
   * The editor's version after the change.
   */
  document_version?: number | string | null;
  /**
   * `user` aborts the active run; `agent` (edits made by tool calls) never does.
   */
  origin?: "user" | "agent";
  /**
   * What changed, in a few words.
   */
  summary?: string | null;
  /**
   * The edits, in order, each in the coordinates left by the previous one (1.1).
   * Without them a user edit is taken to touch the whole document.
   */
  changes?: TextChange[] | null;
}
/**
 * One edit: `[from, to)` of the document before it was replaced by `insert` units (1.1).
 */
export interface TextChange {
  /**
   * Start of the replaced range.
   */
  from: number;
  /**
   * End of the replaced range (exclusive); `to == from` for a pure insertion.
   */
  to: number;
  /**
   * How many units of new content replaced it (0 for a pure deletion).
   */
  insert: number;
}
/**
 * Application-level ping; the server answers `pong` with the same `ts`.
 */
export interface PingMessage {
  /**
   * Echoed as `reply_to` in the `ack` or `error` that answers this message.
   */
  id?: string | null;
  type: "ping";
  /**
   * Any number, echoed in `pong`.
   */
  ts?: number | null;
}
/**
 * Answer to a good `hello`; a resumed welcome is followed by the replayed events.
 */
export interface WelcomeEvent {
  type: "welcome";
  /**
   * Protocol version (1).
   */
  protocol: number;
  /**
   * Unique per connection (for logs and support).
   */
  session_id: string;
  /**
   * The document this connection opened.
   */
  document_id: string;
  /**
   * The token's `sub`.
   */
  user_id: string;
  /**
   * `hello.client_id`.
   */
  client_id: string;
  /**
   * `editor`, or `viewer` (read-only: may send only `hello`, `ping`, `auth.refresh`).
   */
  role: "editor" | "viewer";
  /**
   * Identity of the document log; keep it for `hello.resume`.
   */
  epoch: string;
  /**
   * The log's last `seq` when this connection joined.
   */
  last_seq: number;
  /**
   * True: the events after `resume.after_seq` follow, then live ones.
   */
  resumed: boolean;
  /**
   * Why a requested resume was refused: rebuild from `active_run` and the history.
   */
  resume_failed?: "epoch_changed" | "history_truncated";
  /**
   * How many events the replay holds.
   */
  replayed: number;
  active_run?: RunSnapshot;
  limits: Limits;
  /**
   * Runs waiting for the active one, next first (1.1, `if_busy: enqueue`).
   */
  queued_runs: RunSnapshot1[];
  /**
   * The protocol 1.1 additions this server supports (see "Version 1.1").
   */
  features: string[];
}
/**
 * The document's active run, if any.
 */
export interface RunSnapshot {
  /**
   * The run's id.
   */
  run_id: string;
  /**
   * `running`, `waiting_tool` or `waiting_approval` while active.
   */
  status:
    | "queued"
    | "running"
    | "waiting_tool"
    | "waiting_approval"
    | "completed"
    | "cancelled"
    | "aborted"
    | "failed"
    | "timed_out";
  /**
   * As in `run.start`.
   */
  mode: "agent" | "chat";
  /**
   * Who started the run (only this user may approve or cancel).
   */
  user_id: string;
  /**
   * The run's executor: the tab that runs its client tools.
   */
  client_id: string;
  /**
   * Model calls made so far.
   */
  step: number;
  /**
   * Tool calls and approvals the run is waiting for.
   */
  pending: PendingItem[];
}
/**
 * A tool call or approval the run is waiting for.
 */
export interface PendingItem {
  /**
   * `tool`: a client tool call awaiting its result; `approval`: awaiting the user.
   */
  kind: "tool" | "approval";
  /**
   * The call's id.
   */
  call_id: string;
  /**
   * The tool's name.
   */
  name: string;
  /**
   * The call's arguments.
   */
  arguments: {
    [k: string]: unknown;
  };
  /**
   * The call's token (tool calls; only for the run's user).
   */
  token?: string;
  /**
   * Deadline, ms since the Unix epoch.
   */
  expires_at: number;
}
/**
 * This server's limits.
 */
export interface Limits {
  /**
   * Largest frame the server accepts (bigger: `too_large`, close 1009).
   */
  max_message_bytes: number;
  /**
   * Seconds a client has to answer a `tool.call`.
   */
  tool_timeout_s: number;
  /**
   * Seconds a whole run may take.
   */
  run_timeout_s: number;
  /**
   * Model calls per run.
   */
  max_steps: number;
}
/**
 * The state of the document's active run, to rebuild the UI after a reconnect.
 */
export interface RunSnapshot1 {
  /**
   * The run's id.
   */
  run_id: string;
  /**
   * `running`, `waiting_tool` or `waiting_approval` while active.
   */
  status:
    | "queued"
    | "running"
    | "waiting_tool"
    | "waiting_approval"
    | "completed"
    | "cancelled"
    | "aborted"
    | "failed"
    | "timed_out";
  /**
   * As in `run.start`.
   */
  mode: "agent" | "chat";
  /**
   * Who started the run (only this user may approve or cancel).
   */
  user_id: string;
  /**
   * The run's executor: the tab that runs its client tools.
   */
  client_id: string;
  /**
   * Model calls made so far.
   */
  step: number;
  /**
   * Tool calls and approvals the run is waiting for.
   */
  pending: PendingItem[];
}
/**
 * A message with an `id` was accepted (sent only to its sender).
 */
export interface AckEvent {
  type: "ack";
  /**
   * The `id` of the message accepted.
   */
  reply_to?: string;
  /**
   * The run concerned.
   */
  run_id?: string;
  /**
   * The tool call concerned.
   */
  call_id?: string;
  /**
   * True: a repeat of something already done; nothing changed.
   */
  duplicate?: boolean;
  /**
   * E.g. the run's status for `run.start`, `accepted` for `tool.result`.
   */
  status?: string;
}
/**
 * A message was refused (sent only to its sender); the connection stays open unless noted.
 */
export interface ErrorEvent {
  type: "error";
  code: ErrorCode;
  /**
   * For people; never exception text.
   */
  message: string;
  /**
   * The `id` of the message refused, when it could be read.
   */
  reply_to?: string;
  /**
   * The run concerned.
   */
  run_id?: string;
  /**
   * For `invalid_message`: a list of `{loc, msg}` saying where.
   */
  details?: unknown;
  /**
   * For `rate_limited` and `unavailable`: when to try again.
   */
  retry_after_ms?: number;
}
/**
 * Answer to `ping`.
 */
export interface PongEvent {
  type: "pong";
  /**
   * `ping.ts`, echoed.
   */
  ts?: number;
}
/**
 * A run began.
 */
export interface RunStartedEvent {
  /**
   * Position in the document log: per document, from 1, no gaps.
   */
  seq: number;
  /**
   * Server time, ms since the Unix epoch.
   */
  ts: number;
  type: "run.started";
  /**
   * The run's id.
   */
  run_id: string;
  /**
   * As in `run.start`.
   */
  mode: "agent" | "chat";
  /**
   * Who started it.
   */
  user_id: string;
  /**
   * The run's executor: the tab that runs its client tools.
   */
  client_id: string;
  /**
   * The user's request.
   */
  prompt: string;
  /**
   * The conversation thread the run belongs to (1.1).
   */
  thread_id: string;
}
/**
 * A piece of the assistant's text; append it to the message.
 */
export interface MessageDeltaEvent {
  /**
   * Position in the document log: per document, from 1, no gaps.
   */
  seq: number;
  /**
   * Server time, ms since the Unix epoch.
   */
  ts: number;
  type: "message.delta";
  /**
   * The run's id.
   */
  run_id: string;
  /**
   * The assistant message this piece belongs to.
   */
  message_id: string;
  /**
   * Text to append (consecutive deltas may arrive merged).
   */
  delta: string;
}
/**
 * An assistant message is complete.
 */
export interface MessageDoneEvent {
  /**
   * Position in the document log: per document, from 1, no gaps.
   */
  seq: number;
  /**
   * Server time, ms since the Unix epoch.
   */
  ts: number;
  type: "message.done";
  /**
   * The run's id.
   */
  run_id: string;
  /**
   * The message completed.
   */
  message_id: string;
  /**
   * The whole message (the concatenated deltas).
   */
  text: string;
}
/**
 * The model calls a tool; a client tool is executed by the tab named in `client_id`.
 */
export interface ToolCallEvent {
  /**
   * Position in the document log: per document, from 1, no gaps.
   */
  seq: number;
  /**
   * Server time, ms since the Unix epoch.
   */
  ts: number;
  type: "tool.call";
  /**
   * The run's id.
   */
  run_id: string;
  /**
   * The call's id; answer with `tool.result.call_id`.
   */
  call_id: string;
  /**
   * The tool's name.
   */
  name: string;
  /**
   * Arguments, already validated against the tool's `parameters`.
   */
  arguments: {
    [k: string]: unknown;
  };
  /**
   * `client`: the tab `client_id` must run it; `server`: informational.
   */
  executor: "client" | "server";
  /**
   * Client tools: the tab that must execute the call.
   */
  client_id?: string;
  /**
   * Client tools: single-use token to copy into `tool.result`.
   */
  token?: string;
  /**
   * Client tools: deadline for the result, ms since the Unix epoch.
   */
  expires_at?: number;
  /**
   * The latest document version the server knew when it sent the call (1.1): from
   * `context.document.version`, later `editor.change`s and the run's earlier
   * `tool.result.document_version` (an integer version never moves back on a result).
   * A client may refuse a call computed on an older document with error code `stale`.
   */
  document_version?: number | string;
}
/**
 * A call of a `requires_approval` tool waits for the run's user.
 */
export interface ApprovalRequestedEvent {
  /**
   * Position in the document log: per document, from 1, no gaps.
   */
  seq: number;
  /**
   * Server time, ms since the Unix epoch.
   */
  ts: number;
  type: "approval.requested";
  /**
   * The run's id.
   */
  run_id: string;
  /**
   * The call awaiting approval; answer with `approval.call_id`.
   */
  call_id: string;
  /**
   * The tool's name.
   */
  name: string;
  /**
   * The arguments the model proposes.
   */
  arguments: {
    [k: string]: unknown;
  };
  /**
   * Deadline for the answer, ms since the Unix epoch.
   */
  expires_at: number;
}
/**
 * An approval was answered (close the dialog in every tab).
 */
export interface ApprovalResolvedEvent {
  /**
   * Position in the document log: per document, from 1, no gaps.
   */
  seq: number;
  /**
   * Server time, ms since the Unix epoch.
   */
  ts: number;
  type: "approval.resolved";
  /**
   * The run's id.
   */
  run_id: string;
  /**
   * The call that was approved or rejected.
   */
  call_id: string;
  /**
   * The answer.
   */
  decision: "approve" | "reject";
  /**
   * Who answered.
   */
  user_id: string;
}
/**
 * A tool call ended, however it ended.
 */
export interface ToolDoneEvent {
  /**
   * Position in the document log: per document, from 1, no gaps.
   */
  seq: number;
  /**
   * Server time, ms since the Unix epoch.
   */
  ts: number;
  type: "tool.done";
  /**
   * The run's id.
   */
  run_id: string;
  /**
   * The call that ended.
   */
  call_id: string;
  /**
   * `ok`, `error`, `rejected` (by the user), `timeout` or `cancelled` (run ended).
   */
  status: "ok" | "error" | "rejected" | "timeout" | "cancelled";
  /**
   * With `ok`: the result.
   */
  output?: unknown;
  /**
   * Otherwise: `{message, code?}`.
   */
  error?: {
    [k: string]: unknown;
  };
}
/**
 * A run ended; exactly one per run.
 */
export interface RunFinishedEvent {
  /**
   * Position in the document log: per document, from 1, no gaps.
   */
  seq: number;
  /**
   * Server time, ms since the Unix epoch.
   */
  ts: number;
  type: "run.finished";
  /**
   * The run's id.
   */
  run_id: string;
  /**
   * `completed`, `cancelled`, `aborted`, `failed` or `timed_out`.
   */
  status: "completed" | "cancelled" | "aborted" | "failed" | "timed_out";
  /**
   * Why it ended early, e.g. `document_changed`, `user_cancelled`, `max_steps`.
   */
  reason?: string;
  error?: RunError;
  /**
   * Model calls made.
   */
  steps: number;
  /**
   * Token usage reported by the model provider, if any.
   */
  usage?: {
    [k: string]: unknown;
  };
}
/**
 * With `failed`: what failed.
 */
export interface RunError {
  /**
   * Machine-readable, e.g. `upstream_error`.
   */
  code: string;
  /**
   * For people; never exception text.
   */
  message: string;
  /**
   * Upstream failures: {kind, status?} (the kinds: see "Version 1.1").
   */
  details?: {
    [k: string]: unknown;
  };
}
/**
 * Someone's editor reported a change (`editor.change`).
 */
export interface DocumentChangedEvent {
  /**
   * Position in the document log: per document, from 1, no gaps.
   */
  seq: number;
  /**
   * Server time, ms since the Unix epoch.
   */
  ts: number;
  type: "document.changed";
  /**
   * The editor's version after the change.
   */
  document_version?: number | string;
  /**
   * Who changed it.
   */
  user_id: string;
  /**
   * In which tab.
   */
  client_id: string;
  /**
   * `user`: typed by a person; `agent`: applied by a tool call.
   */
  origin: "user" | "agent";
  /**
   * The `editor.change`'s `changes`, when it sent them (1.1): what a run that waited
   * in the queue meanwhile is judged by when it starts.
   */
  changes?: ChangeSpan[];
}
/**
 * One edit: `[from, to)` of the document before it was replaced by `insert` units.
 */
export interface ChangeSpan {
  /**
   * Start of the replaced range.
   */
  from: number;
  /**
   * End of the replaced range (exclusive).
   */
  to: number;
  /**
   * How many units of new content replaced it.
   */
  insert: number;
}
/**
 * An edit outside the run's scope moved it (1.1, `on_edit: overlap`).
 */
export interface RunScopeChangedEvent {
  /**
   * Position in the document log: per document, from 1, no gaps.
   */
  seq: number;
  /**
   * Server time, ms since the Unix epoch.
   */
  ts: number;
  type: "run.scope";
  /**
   * The run.
   */
  run_id: string;
  /**
   * The scope after the edit.
   */
  scope: ScopeSpan[];
  /**
   * The version the edit produced.
   */
  document_version?: number | string;
  /**
   * Who edited.
   */
  user_id: string;
}
/**
 * A range of the document, `[from, to)`.
 */
export interface ScopeSpan {
  /**
   * Start offset.
   */
  from: number;
  /**
   * End offset (exclusive).
   */
  to: number;
}
/**
 * A `run.start` with `if_busy: enqueue` waits for the active run (1.1).
 */
export interface RunQueuedEvent {
  /**
   * Position in the document log: per document, from 1, no gaps.
   */
  seq: number;
  /**
   * Server time, ms since the Unix epoch.
   */
  ts: number;
  type: "run.queued";
  /**
   * The queued run's id.
   */
  run_id: string;
  /**
   * Who asked for it.
   */
  user_id: string;
  /**
   * Its executor.
   */
  client_id: string;
  /**
   * The user's request.
   */
  prompt: string;
  /**
   * 1 = next to start.
   */
  position: number;
}
/**
 * Another instance took the run over and goes on from its last checkpoint (1.1).
 */
export interface RunResumedEvent {
  /**
   * Position in the document log: per document, from 1, no gaps.
   */
  seq: number;
  /**
   * Server time, ms since the Unix epoch.
   */
  ts: number;
  type: "run.resumed";
  /**
   * The run.
   */
  run_id: string;
  /**
   * Model calls made before the takeover.
   */
  step: number;
  /**
   * `owner_lost`: the instance running it died; `handoff`: it was shutting down.
   */
  reason: "owner_lost" | "handoff";
}
/**
 * Drop the text of this message: the model call that streamed it is made again (1.1).
 */
export interface MessageDiscardedEvent {
  /**
   * Position in the document log: per document, from 1, no gaps.
   */
  seq: number;
  /**
   * Server time, ms since the Unix epoch.
   */
  ts: number;
  type: "message.discarded";
  /**
   * The run.
   */
  run_id: string;
  /**
   * The message whose deltas so far are void.
   */
  message_id: string;
}
