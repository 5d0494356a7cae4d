// The AI SDK and AG-UI adapters driven by the real `ai` and `@ag-ui/client`
// packages against a real cowrite server (`.venv/bin/python -m server`, scripted
// model, COWRITE_DEV=1 for tokens), with a plain `ws` client of the cowrite
// protocol watching the same document. Run: node --test tests/node/
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { fileURLToPath } from "node:url";
import path from "node:path";
import WebSocket from "ws";
import {
  AbstractChat, DefaultChatTransport, WebSocketChatTransport, lastAssistantMessageIsCompleteWithToolCalls,
} from "ai";
import { HttpAgent } from "@ag-ui/client";
import { READ, freePort, last, readingAgent, script, user } from "./adapter_support.mjs";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
let server, base, token;

before(async () => {
  const port = await freePort();
  server = spawn(path.join(ROOT, ".venv/bin/python"), ["-m", "server"], {
    cwd: ROOT, stdio: ["ignore", "ignore", "pipe"],
    env: { ...process.env, COWRITE_DEV: "1", COWRITE_PORT: String(port), COWRITE_LLM: "scripted",
      COWRITE_LOG_LEVEL: "warning", COWRITE_REDIS_URL: "" },
  });
  let exited = null;
  server.once("exit", (code) => { exited = code; });
  server.stderr.on("data", (data) => process.stderr.write(data));
  base = `http://127.0.0.1:${port}`;
  for (;;) {  // ready once /healthz answers (the printed URL goes to the terminal)
    if (exited !== null) throw new Error(`server exited ${exited}`);
    try { if ((await fetch(`${base}/healthz`)).ok) break; } catch { /* not yet */ }
    await new Promise((resolve) => setTimeout(resolve, 50));  // poll until it listens
  }
  const response = await fetch(`${base}/v1/dev/token`, {
    method: "POST", headers: { "content-type": "application/json" },
    body: JSON.stringify({ user: "alice" }) });
  token = (await response.json()).token;
});

after(() => server?.kill());

const slowScript = (text) => JSON.stringify({ script: [{ say: text }], chunk_chars: 1, delay_ms: 20 });
const REPLACE = { name: "replace_document", description: "Replace it.", requires_approval: true,
  parameters: { type: "object", required: ["text"], properties: { text: { type: "string" } } } };

/** A cowrite WebSocket client of `doc` that records every event. */
async function watcher(doc, clientId = "watcher") {
  const ws = new WebSocket(`${base.replace("http", "ws")}/v1/documents/${doc}/ws`);
  const events = [];
  const waiters = [];
  ws.on("message", (data) => {
    const event = JSON.parse(String(data));
    events.push(event);
    for (const w of [...waiters]) if (w.match(event)) { waiters.splice(waiters.indexOf(w), 1); w.resolve(event); }
  });
  await new Promise((resolve) => ws.once("open", resolve));
  const next = (match) => {
    const found = events.find(match);
    return found ? Promise.resolve(found) : new Promise((resolve) => waiters.push({ match, resolve }));
  };
  ws.send(JSON.stringify({ type: "hello", protocol: 1, client_id: clientId, token }));
  await next((e) => e.type === "welcome");
  return { ws, events, next, send: (m) => ws.send(JSON.stringify(m)) };
}

test("DefaultChatTransport: a client tool answered by the frontend continues the same run", async () => {
  const doc = "node-ai-1";
  const watch = await watcher(doc);
  const transport = new DefaultChatTransport({
    api: `${base}/v1/ai-sdk/${doc}/chat`, headers: { authorization: `Bearer ${token}` },
    body: { tools: [READ] } });
  const prompt = user(script({ say: "Reading.", tool_calls: [{ name: "read_document", arguments: {} }] },
    { say: "It says hi." }));
  const first = await last(await transport.sendMessages({
    chatId: "chat-a", messages: [prompt], trigger: "submit-message", messageId: undefined,
    abortSignal: undefined }));
  const part = first.parts.find((p) => p.type === "tool-read_document");
  assert.equal(part.state, "input-available");
  part.state = "output-available";
  part.output = { text: "hi" };
  const second = await last(await transport.sendMessages({
    chatId: "chat-a", messages: [prompt, first], trigger: "submit-message", messageId: undefined,
    abortSignal: undefined }), first);
  const text = second.parts.filter((p) => p.type === "text").map((p) => p.text);
  assert.deepEqual(text, ["Reading.", "It says hi."]);
  const finished = await watch.next((e) => e.type === "run.finished");
  assert.equal(finished.status, "completed");
  assert.equal(watch.events.filter((e) => e.type === "run.started").length, 1);
  assert.deepEqual(watch.events.find((e) => e.type === "tool.done").output, { text: "hi" });
  watch.ws.close();
});

/** What `useChat` runs, minus React: the SDK's Chat over an in-memory state. */
class MemoryChat extends AbstractChat {
  constructor(init) {
    const state = { status: "ready", error: undefined, messages: [],
      pushMessage(m) { this.messages = this.messages.concat(m); },
      popMessage() { this.messages = this.messages.slice(0, -1); },
      replaceMessage(i, m) { this.messages = [...this.messages.slice(0, i), m, ...this.messages.slice(i + 1)]; },
      snapshot: (x) => structuredClone(x) };
    super({ ...init, state });
  }
}

for (const closing of ["with", "without"]) test(`useChat's usual client-tool setup (sendAutomaticallyWhen) ends ready, not in a 409: a run ending ${closing} text after the result`, async () => {
  const doc = `node-ai-auto-${closing}`;
  const watch = await watcher(doc);
  const statuses = [];
  const transport = new DefaultChatTransport({
    api: `${base}/v1/ai-sdk/${doc}/chat`, headers: { authorization: `Bearer ${token}` },
    body: { tools: [READ] },
    fetch: async (url, init) => { const r = await fetch(url, init); statuses.push(r.status); return r; } });
  const errors = [];
  const chat = new MemoryChat({ id: "chat-auto", transport,
    sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithToolCalls,
    onError: (error) => errors.push(error.message),
    onToolCall: ({ toolCall }) => {
      chat.addToolOutput({ tool: toolCall.toolName, toolCallId: toolCall.toolCallId,
        output: { text: "hi" } });
    } });
  await chat.sendMessage({ text: script({ say: "Reading.", tool_calls: [{ name: "read_document", arguments: {} }] },
    closing === "with" ? { say: "It says hi." } : {}) });
  const finished = await watch.next((e) => e.type === "run.finished");
  assert.equal(finished.status, "completed");
  for (let i = 0; i < 100 && (chat.status !== "ready" || statuses.length < 2); i++) {
    await new Promise((resolve) => setTimeout(resolve, 20));  // the automatic send settles
  }
  await new Promise((resolve) => setTimeout(resolve, 200));  // room for a third send, if any
  assert.deepEqual(statuses, [200, 200]);  // the answer; no send after the run's end
  assert.deepEqual(errors, []);
  assert.equal(chat.status, "ready");
  const parts = chat.messages.at(-1).parts;
  assert.deepEqual(parts.filter((p) => p.type === "text").map((p) => p.text),
    closing === "with" ? ["Reading.", "It says hi."] : ["Reading."]);
  const lastStep = parts.slice(parts.findLastIndex((p) => p.type === "step-start") + 1);
  assert.deepEqual(lastStep.map((p) => p.type), closing === "with" ? ["text"] : []);
  watch.ws.close();
});

test("DefaultChatTransport: an approval, then reconnectToStream mid-run replays it", async () => {
  const doc = "node-ai-2";
  const transport = new DefaultChatTransport({
    api: `${base}/v1/ai-sdk/${doc}/chat`, headers: { authorization: `Bearer ${token}` },
    body: { tools: [REPLACE] } });
  const prompt = user(script({ tool_calls: [{ name: "replace_document", arguments: { text: "New" } }] },
    { say: "Replaced the whole text." }));
  const asked = await last(await transport.sendMessages({
    chatId: "chat-b", messages: [prompt], trigger: "submit-message", abortSignal: undefined }));
  const part = asked.parts.find((p) => p.type === "tool-replace_document");
  assert.equal(part.state, "approval-requested");
  part.state = "approval-responded";
  part.approval = { id: part.approval.id, approved: true };
  const approved = await last(await transport.sendMessages({
    chatId: "chat-b", messages: [prompt, asked], trigger: "submit-message", abortSignal: undefined }),
    asked);
  const call = approved.parts.find((p) => p.type === "tool-replace_document");
  assert.equal(call.state, "input-available");  // approved: now the client runs it
  // While the run waits on the client, a reconnect replays the whole message.
  const replay = await transport.reconnectToStream({ chatId: "chat-b" });
  assert.ok(replay);
  const replayed = await last(replay);
  assert.equal(replayed.parts.find((p) => p.type === "tool-replace_document").input.text, "New");
  call.state = "output-available";
  call.output = "replaced";
  const done = await last(await transport.sendMessages({
    chatId: "chat-b", messages: [prompt, approved], trigger: "submit-message", abortSignal: undefined }),
    approved);
  assert.equal(done.parts.at(-1).text, "Replaced the whole text.");
  assert.equal(await transport.reconnectToStream({ chatId: "chat-b" }), null);  // 204: none active
});

test("WebSocketChatTransport: streams, and the abort signal cancels the run", async () => {
  const doc = "node-ai-3";
  const watch = await watcher(doc);
  const transport = new WebSocketChatTransport({
    url: `${base}/v1/ai-sdk/${doc}/ws`, webSocket: WebSocket,
    headers: { authorization: `Bearer ${token}` } });
  const quick = await last(await transport.sendMessages({
    chatId: "chat-c", messages: [user(script({ say: "Hello there." }))], trigger: "submit-message",
    abortSignal: undefined }));
  assert.equal(quick.parts.find((p) => p.type === "text").text, "Hello there.");

  const controller = new AbortController();
  const stream = await transport.sendMessages({
    chatId: "chat-c", messages: [user(slowScript("a long answer that takes a while"))],
    trigger: "submit-message", abortSignal: controller.signal });
  const reader = stream.getReader();
  for (;;) {  // wait until text streams, then abort
    const { value } = await reader.read();
    if (value.type === "text-delta") break;
  }
  const running = await watch.next((e) => e.type === "run.started" && e.prompt.includes("long answer"));
  controller.abort();
  const finished = await watch.next((e) => e.type === "run.finished" && e.run_id === running.run_id);
  assert.deepEqual([finished.status, finished.reason], ["cancelled", "user_cancelled"]);
  transport.close();
  watch.ws.close();
});

test("an editor's change from a WebSocket client aborts an AI SDK run", async () => {
  const doc = "node-ai-4";
  const editor = await watcher(doc, "editor-tab");
  const transport = new WebSocketChatTransport({
    url: `${base}/v1/ai-sdk/${doc}/ws`, webSocket: WebSocket, params: { token } });
  const stream = await transport.sendMessages({
    chatId: "chat-d", messages: [user(slowScript("this will be interrupted by typing"))],
    trigger: "submit-message", abortSignal: undefined });
  const chunks = [];
  const reading = (async () => { for await (const chunk of stream) chunks.push(chunk); })();
  await editor.next((e) => e.type === "message.delta");
  editor.send({ type: "editor.change", origin: "user" });
  await reading;
  assert.deepEqual(chunks.at(-1), { type: "abort", reason: "aborted: document_changed" });
  transport.close();
  editor.ws.close();
});

test("AG-UI HttpAgent: a run aborted by an editor's change finishes cancelled, not failed", async () => {
  const doc = "node-agui-abort";
  const editor = await watcher(doc, "editor-tab");
  const agent = new HttpAgent({ url: `${base}/v1/agui/${doc}`, threadId: "thread-a",
    headers: { authorization: `Bearer ${token}` } });
  agent.addMessage({ id: "m1", role: "user", content: slowScript("this will be interrupted") });
  const seen = { finished: [], failed: [] };
  const running = agent.runAgent({ runId: "agui-abort-1" }, {
    onRunFinishedEvent: ({ outcome, event }) => { seen.finished.push([outcome, event.metadata]); },
    onRunErrorEvent: ({ event }) => { seen.failed.push(event.code); },
  });
  await editor.next((e) => e.type === "message.delta");
  editor.send({ type: "editor.change", origin: "user" });
  await running; // a RUN_ERROR rejected here: the user's own edit read as the agent failing
  assert.deepEqual(seen.failed, []);
  assert.deepEqual(seen.finished,
    [["cancelled", { cowrite: { status: "aborted", reason: "document_changed" } }]]);
  const finished = await editor.next((e) => e.type === "run.finished");
  assert.deepEqual([finished.run_id, finished.status], ["agui-abort-1", "aborted"]);
  editor.ws.close();
});

test("AG-UI HttpAgent: a frontend tool continues the same cowrite run", async () => {
  const doc = "node-agui-1";
  const watch = await watcher(doc);
  const { agent, tools } = readingAgent(HttpAgent, `${base}/v1/agui/${doc}`, "thread-1", token);
  await agent.runAgent({ runId: "agui-node-1", tools });
  const assistant = agent.messages.find((m) => m.role === "assistant" && m.toolCalls?.length);
  const callId = assistant.toolCalls[0].id;
  assert.equal(assistant.toolCalls[0].function.name, "read_document");
  agent.addMessage({ id: "m3", role: "tool", toolCallId: callId, content: JSON.stringify({ text: "doc" }) });
  await agent.runAgent({ runId: "agui-node-2", tools });
  const texts = agent.messages.filter((m) => m.role === "assistant" && m.content).map((m) => m.content);
  assert.deepEqual(texts, ["Let me read.", "Done reading."]);
  const finished = await watch.next((e) => e.type === "run.finished");
  assert.deepEqual([finished.run_id, finished.status], ["agui-node-1", "completed"]);
  watch.ws.close();
});
