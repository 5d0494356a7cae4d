// A typed use of the client, checked by `tsc --noEmit` (tests/test_typed_client.py).
// It imports the package by name, as an app with a bundler would, so the check
// also covers static/package.json's `exports`. Every `@ts-expect-error` line is
// a mistake the types must catch: if one stops being an error, tsc fails with
// "Unused '@ts-expect-error' directive".
import {
  CLOSE,
  CowriteClient,
  backoffDelay,
  closeAction,
  diffChange,
  type ClientMessage,
  type EditChange,
  type DurableEvent,
  type EventOfType,
  type RunFinishedEvent,
  type ServerEvent,
  type ToolSpec,
} from "@cowrite/client";

const client = new CowriteClient({
  baseUrl: "ws://127.0.0.1:8000",
  documentId: "doc-1",
  getToken: async () => "jwt",
});

// @ts-expect-error documentId is required
new CowriteClient({ baseUrl: "ws://x", getToken: () => "jwt" });

const insertText: ToolSpec = {
  name: "insert_text",
  description: "Insert text at the end.",
  parameters: { type: "object", properties: { text: { type: "string" } }, required: ["text"] },
};
// @ts-expect-error a ToolSpec needs a name
const nameless: ToolSpec = { description: "no name" };
void nameless;

let documentText = "";
client.registerTool<{ text: string }>(insertText, (args, call) => {
  documentText += args.text;
  const runId: string = call.run_id;
  client.editorChange({ origin: "agent", summary: `tool ${call.name} in ${runId}` });
  return { ok: true };
});
// @ts-expect-error handler arguments are what registerTool's type argument says
client.registerTool<{ text: string }>(insertText, (args) => args.count);

client.addEventListener("message.delta", (event) => {
  const piece: string = event.detail.delta;
  documentText += piece;
  // @ts-expect-error message.delta has no `text` (message.done has)
  void event.detail.text;
});

client.addEventListener("tool.call", (event) => {
  const call = event.detail;
  if (call.executor === "client" && call.client_id === client.clientId) {
    const expires: number | undefined = call.expires_at;
    void expires;
  }
});

client.addEventListener("approval.requested", async (event) => {
  const { run_id, call_id, name, arguments: args } = event.detail;
  if (name === "replace_document" && typeof args.text === "string") {
    await client.approve(run_id, call_id, { scope: "run" });
  } else {
    await client.reject(run_id, call_id, "not now");
  }
  // @ts-expect-error scope is "call" or "run"
  await client.approve(run_id, call_id, { scope: "forever" });
});

client.addEventListener("run.finished", (event) => {
  const finished: RunFinishedEvent = event.detail;
  // @ts-expect-error "superseded" is a reason, not a status
  if (finished.status === "superseded") return;
  const failedCode: string | undefined = finished.error?.code;
  void failedCode;
});

client.addEventListener("state", (event) => {
  const detail = event.detail;
  if (detail.state === "open" && !detail.resumed && detail.resumeFailed) {
    const why: "epoch_changed" | "history_truncated" = detail.resumeFailed;
    void why;
  }
  if (detail.state === "reconnecting") {
    const delay: number | undefined = detail.delay;
    void delay;
  }
});

client.addEventListener("tool.executed", (event) => {
  const ms: number = event.detail.ms;
  const output: unknown = event.detail.result.output;
  void [ms, output];
});

/** Narrowing the event union by `type`, as a reducer would. */
function describe(event: ServerEvent): string {
  switch (event.type) {
    case "welcome":
      return `joined ${event.document_id} at seq ${event.last_seq} as ${event.role}`;
    case "message.delta":
      return event.delta;
    case "tool.done":
      return `${event.call_id}: ${event.status}`;
    case "error":
      return `${event.code}: ${event.message}`;
    case "run.finished":
      return `${event.run_id} ${event.status} after ${event.steps} steps`;
    default:
      return event.type;
  }
}

function seqOf(event: DurableEvent): number {
  return event.seq;
}

// @ts-expect-error welcome is not logged: it has no seq
seqOf({} as EventOfType<"welcome">);

client.addEventListener("event", (event) => {
  void describe(event.detail);
});

async function run(): Promise<void> {
  client.connect();
  const ack = await client.startRun({
    prompt: "Tighten the intro",
    context: { document: { text: documentText, version: 3 } },
    options: { max_steps: 5 },
  });
  const runId: string | undefined = ack.run_id ?? undefined;
  if (runId) await client.cancelRun(runId, "changed my mind");
  // @ts-expect-error mode is "agent" or "chat"
  await client.startRun({ prompt: "x", mode: "autopilot" });
  // @ts-expect-error prompt is required
  await client.startRun({ mode: "chat" });

  // Edit-aware runs (protocol 1.1): a scoped run, and the changes of a user edit.
  if (client.supports("edit_scope")) {
    await client.startRun({ prompt: "Fix the first line", scope: [{ from: 0, to: 12 }],
                            onEdit: "overlap", ifBusy: "enqueue" });
    // @ts-expect-error on_edit is "abort", "overlap" or "continue"
    await client.startRun({ prompt: "x", onEdit: "ignore" });
  }
  const change: EditChange | null = diffChange("Hello", "Hello!", 6);
  if (change) client.editorChange({ documentVersion: 4, changes: [change] });
  // @ts-expect-error insert is a count of units, not the inserted text
  client.editorChange({ changes: [{ from: 0, to: 0, insert: "x" }] });
  const version: number | string | undefined = client.documentVersion;
  void version;

  const ping: ClientMessage = { type: "ping", ts: Date.now() };
  client.send(ping);
  const refreshed = await client.send({ type: "auth.refresh", token: "jwt-2" }, true);
  void refreshed.status;
  // @ts-expect-error tool.result needs run_id, call_id and token
  client.send({ type: "tool.result", output: 1 });
  // @ts-expect-error no such message type
  client.send({ type: "run.pause", run_id: "r" });

  try {
    await client.refreshAuth("jwt-3");
  } catch (error) {
    const code = (error as import("@cowrite/client").CowriteRequestError).event?.code;
    void code;
  }
  client.close();
}

const action: "retry" | "reauth" | "stop" = closeAction(CLOSE.SLOW_CONSUMER);
const delay: number = backoffDelay(3, { baseMs: 100 });
void [action, delay, run];

client.addEventListener("edits.pending", (event) => {
  const waitS: number = event.detail.retryInMs / 1000;
  const code: "unavailable" | "rate_limited" = event.detail.code;
  void waitS; void code; void event.detail.count;
});
client.addEventListener("edit.dropped", (event) => { void event.detail.message.document_version; });
