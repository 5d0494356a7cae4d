// The AI SDK and AG-UI adapters behind a load balancer that is not sticky: the real
// `ai` and `@ag-ui/client` packages start a chat's run through one cowrite instance
// and carry it on through another (two `python -m server` processes on one real
// redis-server started here). Run: node --test tests/node/adapters_cluster.test.mjs
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import { fileURLToPath } from "node:url";
import path from "node:path";
import { DefaultChatTransport } from "ai";
import { HttpAgent } from "@ag-ui/client";
import { READ, freePort, last, readingAgent, script, user } from "./adapter_support.mjs";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const HAVE_REDIS = spawnSync("redis-server", ["--version"]).status === 0;
if (!HAVE_REDIS && process.env.CI === "true") throw new Error("redis-server is required in CI");
const skip = HAVE_REDIS ? false : "redis-server not found (apt-get install redis-server)";
const SECRET = "adapters-cluster-test-secret-0123456789";
const children = [];
let one, two, token;

function started(command, args, env) {
  const child = spawn(command, args, { cwd: ROOT, stdio: ["ignore", "ignore", "pipe"], env });
  child.stderr.on("data", (data) => process.stderr.write(data));
  children.push(child);
  return child;
}

async function until(ready, child, what) {
  let exited = null;
  child.once("exit", (code) => { exited = code; });
  for (let i = 0; i < 1200; i++) {  // a minute: imports alone took 15 s on a loaded machine
    if (exited !== null) throw new Error(`${what} exited ${exited}`);
    try { if (await ready()) return; } catch { /* not yet */ }
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  throw new Error(`${what} did not start`);
}

async function instance(redisUrl) {
  const port = await freePort();
  const child = started(path.join(ROOT, ".venv/bin/python"), ["-m", "server"], {
    ...process.env, COWRITE_DEV: "1", COWRITE_PORT: String(port), COWRITE_LLM: "scripted",
    COWRITE_LOG_LEVEL: "warning", COWRITE_REDIS_URL: redisUrl, COWRITE_JWT_SECRET: SECRET });
  const base = `http://127.0.0.1:${port}`;
  await until(async () => (await fetch(`${base}/readyz`)).ok, child, "cowrite");
  return base;
}

before(async () => {
  if (!HAVE_REDIS) return;
  const port = await freePort();
  const redis = started("redis-server", ["--port", String(port), "--bind", "127.0.0.1",
    "--save", "", "--appendonly", "no"], process.env);
  await until(() => spawnSync("redis-cli", ["-p", String(port), "ping"]).stdout?.toString()
    .includes("PONG"), redis, "redis-server");
  [one, two] = await Promise.all([instance(`redis://127.0.0.1:${port}/0`),
    instance(`redis://127.0.0.1:${port}/0`)]);
  const response = await fetch(`${one}/v1/dev/token`, {
    method: "POST", headers: { "content-type": "application/json" },
    body: JSON.stringify({ user: "alice" }) });
  token = (await response.json()).token;
});

after(async () => {
  for (const child of children.reverse()) {
    if (child.exitCode !== null) continue;
    const gone = new Promise((resolve) => child.once("exit", resolve));
    child.kill();
    await gone;
  }
});


const transport = (base, doc) => new DefaultChatTransport({
  api: `${base}/v1/ai-sdk/${doc}/chat`, headers: { authorization: `Bearer ${token}` },
  body: { tools: [READ] } });

test("DefaultChatTransport: a chat started on one instance goes on through another", { skip },
  async () => {
    const doc = "node-cluster-1";
    const prompt = user(script({ say: "Reading.", tool_calls: [{ name: "read_document", arguments: {} }] },
      { say: "It says hi." }));
    const first = await last(await transport(one, doc).sendMessages({
      chatId: "chat-x", messages: [prompt], trigger: "submit-message", abortSignal: undefined }));
    const part = first.parts.find((p) => p.type === "tool-read_document");
    assert.equal(part.state, "input-available");

    // A reload whose reconnect reaches the other instance gets the same message back.
    const replay = await transport(two, doc).reconnectToStream({ chatId: "chat-x" });
    assert.ok(replay);
    assert.deepEqual(await last(replay), first);

    part.state = "output-available";
    part.output = { text: "hi" };
    const second = await last(await transport(two, doc).sendMessages({
      chatId: "chat-x", messages: [prompt, first], trigger: "submit-message", abortSignal: undefined }),
    first);
    assert.equal(second.id, first.id);  // one assistant message, carried on
    assert.deepEqual(second.parts.filter((p) => p.type === "text").map((p) => p.text),
      ["Reading.", "It says hi."]);
    for (const base of [one, two]) {  // finished: no instance has it active any more, once
      // the end has reached it (on a loaded host a moment after the frontend saw it: the
      // reconnect then replays the run, harmlessly; seen once in CI)
      let stream = await transport(base, doc).reconnectToStream({ chatId: "chat-x" });
      for (let tries = 0; stream !== null && tries < 50; tries += 1) {
        await stream.cancel();
        await new Promise((resolve) => setTimeout(resolve, 100));
        stream = await transport(base, doc).reconnectToStream({ chatId: "chat-x" });
      }
      assert.equal(stream, null);
    }
  });

test("AG-UI HttpAgent: a thread started on one instance goes on through another", { skip },
  async () => {
    const doc = "node-cluster-2";
    const { agent, tools } = readingAgent(HttpAgent, `${one}/v1/agui/${doc}`, "thread-x", token);
    await agent.runAgent({ runId: "agui-cluster-1", tools });
    const assistant = agent.messages.find((m) => m.role === "assistant" && m.toolCalls?.length);
    agent.addMessage({ id: "m3", role: "tool", toolCallId: assistant.toolCalls[0].id,
      content: JSON.stringify({ text: "doc" }) });
    agent.url = `${two}/v1/agui/${doc}`;  // the next request lands on the other instance
    await agent.runAgent({ runId: "agui-cluster-2", tools });
    const texts = agent.messages.filter((m) => m.role === "assistant" && m.content).map((m) => m.content);
    assert.deepEqual(texts, ["Let me read.", "Done reading."]);
  });
