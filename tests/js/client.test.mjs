// client.js without a browser: policies as pure functions, and the client
// against a fake WebSocket (the browser's API is the edge we do not own).
import { test } from "node:test";
import assert from "node:assert/strict";
import {
  CLOSE, CowriteClient, SeqTracker, backoffDelay, closeAction, frameTooLarge, upgradeRefused,
} from "../../static/client.js";

test("close codes decide whether to reconnect", () => {
  for (const code of [1001, 1005, 1006, 1011, 1012, 4008, 4009]) assert.equal(closeAction(code), "retry");
  for (const code of [1000, 1009, 4003, 4400]) assert.equal(closeAction(code), "stop");
  assert.equal(closeAction(CLOSE.UNAUTHENTICATED), "reauth");
});

test("backoff grows exponentially, is capped and jittered", () => {
  assert.equal(backoffDelay(0, { random: () => 1 }), 250);
  assert.equal(backoffDelay(3, { random: () => 1 }), 2000);
  assert.equal(backoffDelay(30, { random: () => 1 }), 10_000);
  assert.equal(backoffDelay(5, { random: () => 0 }), 0);
  const samples = new Set(Array.from({ length: 50 }, () => backoffDelay(4)));
  assert.ok(samples.size > 10, "jitter spreads reconnects");
});

test("seq tracker drops what it has seen and knows where to resume", () => {
  const seq = new SeqTracker();
  assert.equal(seq.resumePoint(), undefined);
  seq.onWelcome({ epoch: "e1", last_seq: 4, resumed: false });
  assert.deepEqual(seq.resumePoint(), { epoch: "e1", after_seq: 4 });
  assert.equal(seq.accept({ type: "x", seq: 4 }), false);
  assert.equal(seq.accept({ type: "x", seq: 5 }), true);
  assert.equal(seq.accept({ type: "x", seq: 5 }), false);
  assert.equal(seq.accept({ type: "ack" }), true); // ephemeral events have no seq
  seq.onWelcome({ epoch: "e1", last_seq: 9, resumed: true });
  assert.equal(seq.lastSeq, 5, "a resumed welcome keeps the position: the replay follows");
  seq.onWelcome({ epoch: "e2", last_seq: 2, resumed: false, resume_failed: "epoch_changed" });
  assert.deepEqual(seq.resumePoint(), { epoch: "e2", after_seq: 2 });
});

class FakeSocket {
  static all = [];
  /** when true, new sockets fail as a refused upgrade does in a browser: close 1006, never open */
  static refuse = false;
  constructor(url, protocols) {
    Object.assign(this, { url, protocols, sent: [], readyState: 0 });
    FakeSocket.all.push(this);
    const refused = FakeSocket.refuse;
    queueMicrotask(() => {
      if (refused) this.serverClose(1006);
      else { this.readyState = 1; this.onopen?.(); }
    });
  }
  send(text) { this.sent.push(JSON.parse(text)); }
  close(code = 1000) { this.serverClose(code); }
  serverSend(event) { this.onmessage?.({ data: JSON.stringify(event) }); }
  serverClose(code, reason = "") { this.readyState = 3; this.onclose?.({ code, reason }); }
}

/** A client on FakeSocket whose timers are `timers` (heartbeat off unless `options` say). */
function makeClient(options = {}) {
  FakeSocket.all = [];
  FakeSocket.refuse = false;
  const timers = [];
  const client = new CowriteClient({
    baseUrl: "ws://server", documentId: "doc 1", getToken: () => "tok", clientId: "tab-1",
    WebSocketImpl: FakeSocket, setTimeout: (fn, ms) => timers.push({ fn, ms }),
    backoff: { random: () => 0.5 }, heartbeatMs: 0, ...options,
  });
  return { client, timers };
}

const tick = () => new Promise((resolve) => setTimeout(resolve, 0));

test("hello, then reconnect with resume and no duplicate events", async () => {
  const { client, timers } = makeClient();
  const seen = [];
  client.addEventListener("event", (e) => seen.push(e.detail.seq ?? e.detail.type));
  client.connect();
  await tick();
  const first = FakeSocket.all[0];
  assert.equal(first.url, "ws://server/v1/documents/doc%201/ws");
  assert.deepEqual(first.protocols, ["cowrite.v1"]);
  assert.deepEqual(first.sent[0], { type: "hello", protocol: 1, client_id: "tab-1", token: "tok" });
  first.serverSend({ type: "welcome", epoch: "E", last_seq: 10, resumed: false });
  first.serverSend({ type: "document.changed", seq: 11 });
  first.serverSend({ type: "document.changed", seq: 12 });
  first.serverClose(1006);
  assert.equal(client.state, "reconnecting");
  assert.equal(timers.length, 1);
  assert.equal(timers[0].ms, 125); // attempt 0: half of 250 with random() = 0.5
  timers[0].fn();
  await tick(); await tick();
  const second = FakeSocket.all[1];
  assert.deepEqual(second.sent[0].resume, { epoch: "E", after_seq: 12 });
  second.serverSend({ type: "welcome", epoch: "E", last_seq: 13, resumed: true, replayed: 1 });
  second.serverSend({ type: "document.changed", seq: 12 }); // overlap at the seam
  second.serverSend({ type: "document.changed", seq: 13 });
  assert.deepEqual(seen, ["welcome", 11, 12, "welcome", 13]);
  assert.equal(client.attempt, 0, "a welcome resets the backoff");
});

test("stop on 4003 and on a normal close; reauth on 4001", async () => {
  const { client, timers } = makeClient();
  client.connect();
  await tick();
  FakeSocket.all[0].serverClose(4003);
  assert.equal(client.state, "closed");
  assert.equal(timers.length, 0);
  client.connect();
  await tick();
  FakeSocket.all[1].serverClose(4001);
  assert.equal(client.state, "reconnecting");
  assert.equal(timers.length, 1);
});

test("a tool call runs once, even when replayed, and its result is resent after a drop", async () => {
  const { client, timers } = makeClient();
  let runs = 0;
  client.registerTool({ name: "read_document", parameters: { type: "object" } }, () => {
    runs += 1;
    return { text: "hello" };
  });
  client.registerTool({ name: "boom" }, () => { throw Object.assign(new Error("nope"), { code: "bad" }); });
  client.connect();
  await tick();
  const ws = FakeSocket.all[0];
  ws.serverSend({ type: "welcome", epoch: "E", last_seq: 0, resumed: false });
  const call = { type: "tool.call", seq: 1, run_id: "r", call_id: "c1", name: "read_document",
                 arguments: {}, executor: "client", client_id: "tab-1", token: "T" };
  ws.serverSend(call);
  ws.serverSend({ ...call, seq: 2, call_id: "c2", name: "boom" });
  ws.serverSend({ ...call, seq: 3, call_id: "c3", client_id: "other-tab" }); // not ours
  await tick();
  assert.equal(runs, 1);
  const results = new Map(ws.sent.filter((m) => m.type === "tool.result").map((m) => [m.call_id, m]));
  assert.deepEqual(results.get("c1"), { type: "tool.result", id: "result:c1", run_id: "r", call_id: "c1", token: "T", output: { text: "hello" } });
  assert.deepEqual(results.get("c2").error, { message: "nope", code: "bad" });
  assert.equal(results.size, 2);
  ws.serverClose(1011);
  timers[0].fn();
  await tick(); await tick();
  const again = FakeSocket.all[1];
  again.serverSend({ type: "welcome", epoch: "E", last_seq: 3, resumed: true, replayed: 0,
    active_run: { run_id: "r", client_id: "tab-1", pending: [
      { kind: "tool", call_id: "c1", name: "read_document", arguments: {}, token: "T", expires_at: 0 }] } });
  ws.serverSend(call); // a late duplicate on the old socket changes nothing
  await tick();
  assert.equal(runs, 1, "not executed twice");
  assert.deepEqual(again.sent.filter((m) => m.type === "tool.result").map((m) => m.call_id), ["c1"]);
});

test("a result refused as unavailable is sent again after retry_after_ms, until its tool.done", async () => {
  const { client, timers } = makeClient();
  client.registerTool({ name: "read_document" }, () => ({ text: "hello" }));
  client.connect();
  await tick();
  const ws = FakeSocket.all[0];
  ws.serverSend({ type: "welcome", epoch: "E", last_seq: 0, resumed: false });
  ws.serverSend({ type: "tool.call", seq: 1, run_id: "r", call_id: "c1", name: "read_document",
                  arguments: {}, executor: "client", client_id: "tab-1", token: "T" });
  await tick();
  const sent = () => ws.sent.filter((m) => m.type === "tool.result");
  assert.equal(sent().length, 1);
  ws.serverSend({ type: "error", code: "unavailable", message: "moving", reply_to: sent()[0].id,
                  run_id: "r", retry_after_ms: 700 });
  ws.serverSend({ type: "error", code: "unavailable", message: "other", reply_to: "m9" });
  assert.deepEqual(timers.map((t) => t.ms), [700], "one retry, for the result only");
  timers[0].fn();
  assert.equal(sent().length, 2);
  assert.deepEqual(sent()[1], sent()[0]);
  ws.serverSend({ type: "error", code: "unavailable", message: "moving", reply_to: sent()[0].id,
                  run_id: "r", retry_after_ms: 700 });
  ws.serverSend({ type: "tool.done", seq: 2, run_id: "r", call_id: "c1", status: "ok" });
  timers[1].fn();
  assert.equal(sent().length, 2, "not after its tool.done");
});

test("startRun declares the registered tools and resolves with the ack", async () => {
  const { client } = makeClient();
  client.registerTool({ name: "read_document", parameters: { type: "object" } }, () => null);
  client.connect();
  await tick();
  const ws = FakeSocket.all[0];
  ws.serverSend({ type: "welcome", epoch: "E", last_seq: 0, resumed: false });
  const pending = client.startRun({ prompt: "hi" });
  const start = ws.sent.at(-1);
  assert.equal(start.type, "run.start");
  assert.deepEqual(start.tools.map((t) => t.name), ["read_document"]);
  ws.serverSend({ type: "ack", reply_to: start.id, run_id: start.run_id, status: "running" });
  assert.equal((await pending).status, "running");
  const refused = client.cancelRun("zzz");
  ws.serverSend({ type: "error", reply_to: ws.sent.at(-1).id, code: "run_not_found", message: "no" });
  await assert.rejects(refused, /no/);
});

test("refused-upgrade rule: only closes 1006 of sockets that never opened, before any welcome", () => {
  const base = { code: 1006, opened: false, unopened: 3, welcomed: false, limit: 3 };
  assert.equal(upgradeRefused(base), true);
  assert.equal(upgradeRefused({ ...base, unopened: 2 }), false, "two may be a blip");
  assert.equal(upgradeRefused({ ...base, opened: true }), false, "a drop after open is the network");
  assert.equal(upgradeRefused({ ...base, code: 1011 }), false);
  assert.equal(upgradeRefused({ ...base, welcomed: true, unopened: 50 }), false,
    "once welcomed, the server is restarting: keep retrying");
  assert.equal(upgradeRefused({ ...base, limit: 0, unopened: 50 }), false, "limit 0 disables it");
});

test("a refused upgrade stops after three attempts and says so; connect() tries again", async () => {
  const { client, timers } = makeClient();
  const states = [];
  client.addEventListener("state", (e) => states.push(e.detail));
  FakeSocket.refuse = true;
  client.connect();
  for (let i = 0; i < 10 && client.state !== "closed"; i += 1) {
    await tick();
    if (timers.length) timers.shift().fn();
    await tick();
  }
  assert.equal(FakeSocket.all.length, 3, "three upgrades, then no loop");
  assert.equal(client.state, "closed");
  const last = states.at(-1);
  assert.equal(last.refused, true);
  assert.equal(last.code, 1006);
  assert.equal(last.attempts, 3);
  assert.match(last.reason, /refused the WebSocket upgrade/);
  assert.equal(timers.length, 0, "no reconnect scheduled");

  FakeSocket.refuse = false;
  client.connect();
  await tick();
  assert.equal(FakeSocket.all.length, 4);
  FakeSocket.all[3].serverSend({ type: "welcome", epoch: "E", last_seq: 0, resumed: false });
  assert.equal(client.state, "open");
});

test("after a welcome, refused upgrades are a restarting server: retried, never stopped", async () => {
  const { client, timers } = makeClient();
  client.connect();
  await tick();
  FakeSocket.all[0].serverSend({ type: "welcome", epoch: "E", last_seq: 0, resumed: false });
  FakeSocket.refuse = true;
  FakeSocket.all[0].serverClose(1006);
  for (let i = 0; i < 8; i += 1) {
    assert.equal(timers.length, 1, `attempt ${i} scheduled`);
    timers.shift().fn();
    await tick(); await tick();
  }
  assert.equal(client.state, "reconnecting");
  assert.equal(FakeSocket.all.length, 9);
  FakeSocket.refuse = false;
  timers.shift().fn();
  await tick(); await tick();
  FakeSocket.all.at(-1).serverSend({ type: "welcome", epoch: "E", last_seq: 0, resumed: true });
  assert.equal(client.state, "open");
});

test("startRun sends thread_id and workflow only to a server that lists threads and workflows", async () => {
  const { client } = makeClient();
  client.connect();
  await tick();
  const ws = FakeSocket.all[0];
  ws.serverSend({ type: "welcome", epoch: "E", last_seq: 0, resumed: false, features: ["threads"] });
  const before = ws.sent.length;
  await assert.rejects(client.startRun({ prompt: "p", workflow: "proofread" }),
    (error) => error.code === "unsupported" && /workflows/.test(error.message));
  assert.equal(ws.sent.length, before, "nothing was sent");
  client.startRun({ prompt: "p", threadId: "side" });
  const start = ws.sent.at(-1);
  assert.equal(start.thread_id, "side");
  assert.equal("workflow" in start, false);
  ws.serverSend({ type: "welcome", epoch: "E", last_seq: 0, resumed: false, features: ["threads", "workflows"] });
  client.startRun({ prompt: "p", workflow: "proofread" });
  assert.equal(ws.sent.at(-1).workflow, "proofread");
  assert.equal("thread_id" in ws.sent.at(-1), false, "no threadId: the server's default thread");
});

test("a frame over welcome.limits.max_message_bytes is refused locally, in UTF-8 bytes", async () => {
  assert.equal(frameTooLarge("x".repeat(100), undefined), null, "no limit: no check");
  assert.equal(frameTooLarge("é".repeat(50), 100), null, "100 bytes fit in 100");
  assert.equal(frameTooLarge("é".repeat(51), 100).code, "too_large");
  assert.equal(frameTooLarge("é".repeat(51), 100).size, 102);
  const { client } = makeClient();
  client.registerTool({ name: "read_document" }, () => ({ text: "y".repeat(5000) }));
  client.connect();
  await tick();
  const ws = FakeSocket.all[0];
  ws.serverSend({ type: "welcome", epoch: "E", last_seq: 0, resumed: false,
                  limits: { max_message_bytes: 2048 } });
  const big = { document: { text: "y".repeat(3000), version: 1 } };
  await assert.rejects(client.startRun({ prompt: "hi", context: big }),
    (error) => error.code === "too_large" && /at most 2048/.test(error.message));
  assert.equal(ws.sent.filter((m) => m.type === "run.start").length, 0, "nothing sent");
  assert.equal(client.runScopes.size, 0);
  assert.throws(() => client.send({ type: "editor.change", summary: "y".repeat(3000) }), /at most 2048/);
  client.startRun({ prompt: "hi", context: { document: { text: "small", version: 1 } } });
  assert.equal(ws.sent.filter((m) => m.type === "run.start").length, 1);
  // A tool result that large would close the connection: the model gets a tool error instead.
  ws.serverSend({ type: "tool.call", seq: 1, run_id: "r", call_id: "c1", name: "read_document",
                  arguments: {}, executor: "client", client_id: "tab-1", token: "T" });
  await tick();
  const result = ws.sent.find((m) => m.type === "tool.result");
  assert.equal(result.output, undefined);
  assert.equal(result.error.code, "too_large");
  assert.equal(client.state, "open");
});

test("a welcome that did not resume forgets the lost runs; tool.done forgets its call", async () => {
  const { client } = makeClient();
  client.registerTool({ name: "read_document" }, () => ({ text: "hello" }));
  client.connect();
  await tick();
  const ws = FakeSocket.all[0];
  ws.serverSend({ type: "welcome", epoch: "E", last_seq: 0, resumed: false });
  client.startRun({ prompt: "a", runId: "lost", context: { document: { text: "t", version: 1 } } });
  client.editorChange({ documentVersion: 2, changes: [] });
  const call = { type: "tool.call", run_id: "lost", name: "read_document", arguments: {},
                 executor: "client", client_id: "tab-1", token: "T" };
  ws.serverSend({ ...call, seq: 1, call_id: "c1" });
  ws.serverSend({ ...call, seq: 2, call_id: "c2" });
  await tick();
  ws.serverSend({ type: "tool.done", seq: 3, run_id: "lost", call_id: "c1", status: "ok" });
  assert.deepEqual([...client.executing], ["c2"], "c1 is done");
  assert.deepEqual([...client.results.keys()], ["c2"]);
  assert.equal(client.edits.length, 1);
  // The server restarted (memory backend): the resume fails, another run is active.
  ws.serverSend({ type: "welcome", epoch: "F", last_seq: 0, resumed: false, resume_failed: "epoch_changed",
                  active_run: { run_id: "other", client_id: "tab-2", pending: [] } });
  assert.deepEqual([...client.runScopes.keys()], []);
  assert.deepEqual([...client.results.keys()], []);
  assert.deepEqual([...client.executing], []);
  assert.deepEqual(client.edits, []);
});
