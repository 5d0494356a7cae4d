// client.js connection lifecycle and tool results when things go wrong: failed
// sockets that only report `error`, connect()/close() in any order, the heartbeat,
// refused or unsendable results, and calls that ended while their handler ran.
// A fake WebSocket that behaves as a browser's (close events come later), plus the
// real `ws` package (tests/node) over a Unix socket when it is installed.
import { test } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";
import os from "node:os";
import path from "node:path";
import fs from "node:fs";
import * as api from "../../static/client.js";
import { CowriteClient } from "../../static/client.js";

class Fake {
  static all = [];
  /** how new sockets end up: "open", "close" (1006 before open) or "error" (only an error) */
  static mode = "open";
  constructor(url) {
    Object.assign(this, { url, sent: [], readyState: 0, closedWith: null });
    Fake.all.push(this);
    const mode = Fake.mode;
    queueMicrotask(() => {
      if (mode === "close") this.serverClose(1006);
      else if (mode === "error") { this.readyState = 3; this.onerror?.({ type: "error" }); }
      else { this.readyState = 1; this.onopen?.(); }
    });
  }
  send(text) { this.sent.push(JSON.parse(text)); }
  /** As in a browser: closing now, the close event later. */
  close(code = 1000) {
    this.closedWith = code;
    this.readyState = 2;
    setTimeout(() => this.serverClose(code), 0);
  }
  serverSend(event) { this.onmessage?.({ data: JSON.stringify(event) }); }
  serverClose(code, reason = "") { this.readyState = 3; this.onclose?.({ code, reason }); }
}

const tick = () => new Promise((resolve) => setTimeout(resolve, 0));

function setup(options = {}) {
  Fake.all = [];
  Fake.mode = "open";
  const timers = [];
  const clock = { now: 0 };
  const client = new CowriteClient({
    baseUrl: "ws://server", documentId: "doc", getToken: () => "tok", clientId: "tab-1",
    WebSocketImpl: Fake, setTimeout: (fn, ms) => timers.push({ fn, ms }), now: () => clock.now,
    backoff: { random: () => 0.5 }, heartbeatMs: 0, ...options,
  });
  const states = [];
  client.addEventListener("state", (e) => states.push(e.detail));
  return { client, timers, clock, states };
}

async function opened(options) {
  const env = setup(options);
  env.client.connect();
  await tick();
  env.ws = Fake.all[0];
  env.ws.serverSend({ type: "welcome", epoch: "E", last_seq: 0, resumed: false });
  return env;
}

const call = (callId, extra = {}) => ({ type: "tool.call", run_id: "r", call_id: callId, name: "t",
  arguments: {}, executor: "client", client_id: "tab-1", token: "T", ...extra });
const results = (ws) => ws.sent.filter((m) => m.type === "tool.result");
/** The editor.changes `ws` was sent, each checked for an id of its own and shown without it. */
const editsSent = (ws) => {
  const edits = ws.sent.filter((m) => m.type === "editor.change");
  assert.equal(new Set(edits.map((m) => m.id)).size, edits.length, "an id names one edit");
  return edits.map(({ id, ...edit }) => {
    assert.match(id, /^e[0-9a-f]{16}\.\d+$/);
    return edit;
  });
};

// -- 1. errors before open ------------------------------------------------------------

test("an error before open counts as a close 1006: retried, then stopped by the refused-upgrade rule", async () => {
  const { client, timers, states } = setup();
  Fake.mode = "error"; // Node's WebSocket on a refused upgrade: an error and nothing else
  client.connect();
  await tick();
  assert.equal(client.state, "reconnecting", "not stuck in connecting");
  assert.equal(states.at(-1).code, 1006);
  for (let i = 0; i < 5 && timers.length; i += 1) {
    timers.shift().fn();
    await tick();
  }
  assert.equal(Fake.all.length, 3);
  assert.equal(client.state, "closed");
  assert.equal(states.at(-1).refused, true);
  assert.equal(states.at(-1).attempts, 3);
});

let WsPackage = null;
try {
  WsPackage = (await import("../node/node_modules/ws/wrapper.mjs")).default;
} catch { /* tests/node's npm packages are not installed */ }

test("with the ws package, a refused upgrade and a server that is down do not crash the process",
  // A skip is a missing check: in CI (`make test` installs tests/node first) it fails.
  { skip: WsPackage || process.env.CI === "true" ? false
    : "tests/node/node_modules (the ws package) is not installed" }, async () => {
    assert.ok(WsPackage, "the ws package (tests/node/node_modules) is required in CI");
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "cowrite-ws-"));
    const socket = path.join(dir, "server.sock");
    const server = http.createServer((request, response) => response.writeHead(404).end());
    server.on("upgrade", (request, sock) => sock.end("HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"));
    await new Promise((resolve) => server.listen(socket, resolve));
    try {
      for (const where of [socket, path.join(dir, "nobody-listens.sock")]) {
        const client = new CowriteClient({
          baseUrl: `ws+unix:${where}:`, documentId: "doc", getToken: () => "tok",
          WebSocketImpl: WsPackage, backoff: { baseMs: 1, maxMs: 2 }, heartbeatMs: 0,
        });
        const closed = new Promise((resolve) => client.addEventListener("state", (e) => {
          if (e.detail.state === "closed") resolve(e.detail);
        }));
        client.connect();
        const detail = await closed;
        assert.equal(detail.refused, true, where);
        assert.equal(detail.attempts, 3);
      }
    } finally {
      server.close();
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

// -- 2. one connection at a time ----------------------------------------------------------

test("connect(); close(); connect() with an async getToken opens one socket", async () => {
  const { client } = setup({ getToken: async () => { await tick(); return "tok"; } });
  client.connect();
  client.close();
  client.connect();
  for (let i = 0; i < 4; i += 1) await tick();
  assert.equal(Fake.all.length, 1, "the first getToken's answer opens nothing");
  assert.equal(client.state, "reconnecting");
  Fake.all[0].serverSend({ type: "welcome", epoch: "E", last_seq: 0, resumed: false });
  assert.equal(client.state, "open");
});

test("close() during a backoff, then connect(): the old retry timer opens nothing", async () => {
  const { client, timers, ws } = await opened();
  ws.serverClose(1006);
  assert.equal(timers.length, 1, "a reconnect is scheduled");
  client.close();
  client.connect();
  await tick();
  assert.equal(Fake.all.length, 2);
  timers.shift().fn(); // the old connection's retry
  await tick();
  assert.equal(Fake.all.length, 2, "no second live socket");
});

test("connect() while open or reconnecting does nothing", async () => {
  const { client, timers, states } = await opened();
  const before = states.length;
  client.connect();
  await tick();
  assert.equal(Fake.all.length, 1);
  assert.equal(states.length, before, "no state event");
  Fake.all[0].serverClose(1011);
  client.connect(); // during the backoff
  await tick();
  assert.equal(Fake.all.length, 1, "the scheduled retry reconnects, not connect()");
  timers.shift().fn();
  await tick();
  assert.equal(Fake.all.length, 2);
});

test("close() rejects pending requests at once, and the closed socket's events are not dispatched", async () => {
  const { client, ws } = await opened();
  const seen = [];
  client.addEventListener("event", (e) => seen.push(e.detail.type));
  const pending = client.cancelRun("r");
  client.close();
  await assert.rejects(pending, /connection closed/);
  assert.equal(ws.closedWith, 1000);
  assert.equal(client.ws, null);
  ws.serverSend({ type: "run.started", seq: 1, run_id: "r2" }); // in flight before its close event
  await tick(); await tick();
  assert.deepEqual(seen, []);
  assert.equal(client.state, "closed");
});

// -- 3 and 4. results that the server refused or that cannot be sent -------------------------

test("a result refused as rate_limited is sent again after retry_after_ms", async () => {
  const { client, timers, ws } = await opened();
  client.registerTool({ name: "t" }, () => "out");
  ws.serverSend(call("c1", { seq: 1 }));
  await tick();
  assert.equal(results(ws).length, 1);
  ws.serverSend({ type: "error", code: "rate_limited", message: "too many messages",
                  reply_to: "result:c1", retry_after_ms: 4 });
  assert.deepEqual(timers.map((t) => t.ms), [4]);
  timers.shift().fn();
  assert.equal(results(ws).length, 2);
  assert.deepEqual(results(ws)[1], results(ws)[0]);
});

test("a cancel answered unavailable is sent again after retry_after_ms, until answered or the run ends", async () => {
  const { client, timers, ws } = await opened();
  const cancels = () => ws.sent.filter((m) => m.type === "run.cancel");
  const first = client.cancelRun("r1", "button");
  ws.serverSend({ type: "error", code: "unavailable", message: "retry shortly",
                  reply_to: cancels()[0].id, run_id: "r1", retry_after_ms: 7 });
  await tick();
  assert.deepEqual(timers.map((t) => t.ms), [7]);
  timers.shift().fn();
  await tick();
  assert.equal(cancels().length, 2);
  ws.serverSend({ type: "ack", reply_to: cancels()[1].id, status: "cancelled" });
  assert.equal((await first).status, "cancelled");

  const second = client.cancelRun("r2");
  ws.serverSend({ type: "error", code: "unavailable", message: "retry shortly",
                  reply_to: cancels()[2].id, run_id: "r2", retry_after_ms: 7 });
  await tick();
  ws.serverSend({ type: "run.finished", run_id: "r2", status: "cancelled", seq: 1 });
  timers.shift().fn();
  assert.equal(await second, undefined); // ended meanwhile: not sent again
  assert.equal(cancels().length, 3);

  const third = client.cancelRun("r3");
  ws.serverSend({ type: "error", code: "run_not_active", message: "no such run",
                  reply_to: cancels()[3].id, run_id: "r3" });
  await assert.rejects(third, /no such run/);
  assert.equal(cancels().length, 4);
});

test("a handler's error code is sent as a string; unserialisable output becomes invalid_output", async () => {
  const { client, ws } = await opened();
  const outputs = {
    abort: () => { throw new DOMException("This operation was aborted", "AbortError"); }, // code 20
    plain: () => { throw new Error("plain"); },
    thrown: () => { throw "a string"; }, // eslint-disable-line no-throw-literal
    cycle: () => { const node = { tag: "p" }; node.parent = node; return node; },
    big: () => ({ n: 10n }),
    fn: () => () => 1,
  };
  const rejections = [];
  const onRejection = (error) => rejections.push(error);
  process.on("unhandledRejection", onRejection);
  try {
    for (const [name, handler] of Object.entries(outputs)) client.registerTool({ name }, handler);
    let seq = 0;
    for (const name of Object.keys(outputs)) ws.serverSend(call(name, { name, seq: ++seq }));
    await tick(); await tick();
  } finally {
    process.off("unhandledRejection", onRejection);
  }
  assert.deepEqual(rejections, []);
  const errors = Object.fromEntries(results(ws).map((r) => [r.call_id, r.error]));
  assert.deepEqual(errors.abort, { message: "This operation was aborted", code: "AbortError" });
  assert.deepEqual(errors.plain, { message: "plain", code: "Error" });
  assert.deepEqual(errors.thrown, { message: "a string" });
  for (const name of ["cycle", "big", "fn"]) {
    assert.equal(errors[name]?.code, "invalid_output", name);
    assert.match(errors[name].message, /cannot be sent as JSON/);
  }
  assert.equal(results(ws).length, 6, "every call got a result");
  assert.ok(results(ws).every((r) => !("output" in r)));
});

// -- 5. heartbeat ------------------------------------------------------------------------------

test("heartbeat: a ping every interval; its pong is not dispatched; silence reconnects and rejects", async () => {
  const { client, timers, clock, states, ws } = await opened({ heartbeatMs: 15_000 });
  const pongs = [];
  client.addEventListener("pong", (e) => pongs.push(e.detail));
  const beat = (ms) => {
    const next = timers.findIndex((t) => t.ms > 0 && t.ms <= 15_000);
    clock.now += ms ?? timers[next].ms;
    timers.splice(next, 1)[0].fn();
  };
  assert.deepEqual(timers.map((t) => t.ms), [15_000], "the first beat");
  beat();
  const ping = ws.sent.at(-1);
  assert.deepEqual(ping, { type: "ping", ts: 15_000 });
  ws.serverSend({ type: "pong", ts: ping.ts });
  ws.serverSend({ type: "pong", ts: 1 }); // the app's own ping
  assert.deepEqual(pongs, [{ type: "pong", ts: 1 }]);
  // The path dies silently: nothing arrives any more.
  const pending = client.cancelRun("r");
  beat(); // t = 30 s, 15 s of silence: ping
  beat(); // t = 45 s, 30 s: ping, next beat when 35 s have passed
  assert.equal(ws.sent.filter((m) => m.type === "ping").length, 3);
  assert.equal(timers.at(-1).ms, 5_000);
  beat();
  assert.equal(client.state, "reconnecting");
  assert.equal(states.at(-1).code, 1006);
  assert.match(states.at(-1).reason, /nothing from the server in 35000 ms/);
  await assert.rejects(pending, /connection closed/);
  assert.equal(ws.closedWith, 1000);
  timers.shift().fn(); // the reconnect
  await tick();
  assert.deepEqual(Fake.all[1].sent[0].resume, { epoch: "E", after_seq: 0 });
});

test("heartbeat: traffic keeps the connection, late timers too; heartbeatMs 0 sends no ping", async () => {
  const { client, timers, clock, ws } = await opened({ heartbeatMs: 1000 });
  for (let i = 0; i < 10; i += 1) {
    clock.now += 1000;
    ws.serverSend({ type: "document.changed", seq: i + 1 });
    timers.shift().fn();
  }
  assert.equal(ws.sent.filter((m) => m.type === "ping").length, 10);
  assert.equal(Fake.all.length, 1);
  // A hidden tab's timers run late (once a minute): the pong of the last ping still counts.
  for (let i = 0; i < 3; i += 1) {
    clock.now += 60_000;
    timers.shift().fn();
    ws.serverSend({ type: "pong", ts: ws.sent.at(-1).ts });
  }
  assert.equal(client.state, "open");
  assert.equal(Fake.all.length, 1);
  clock.now += 60_000;
  timers.shift().fn(); // a ping that gets no answer...
  assert.equal(client.state, "open");
  clock.now += 60_000;
  timers.shift().fn(); // ...judged by a late beat? No: the page may have been paused
  assert.equal(client.state, "open"); // (an alert(), a debugger), its pong still queued
  const due = timers.shift();
  clock.now += due.ms; // an on-time beat: the ping it finds unanswered ends the connection
  due.fn();
  assert.equal(client.state, "reconnecting");
  const off = await opened();
  assert.equal(off.timers.length, 0);
});

test("heartbeat: a page paused 40 s right after a ping keeps its healthy connection", async () => {
  // An alert(), a debugger or a long task: the pong came while the page was paused and
  // is still queued when the (late) beat runs; the connection used to be dropped then.
  const { client, timers, clock, ws } = await opened({ heartbeatMs: 15_000 });
  clock.now += 15_000;
  timers.shift().fn(); // on time: ping
  clock.now += 40_000; // paused; the beat runs before the queued pong
  timers.shift().fn();
  assert.equal(client.state, "open");
  ws.serverSend({ type: "pong", ts: ws.sent.filter((m) => m.type === "ping")[0].ts });
  ws.serverSend({ type: "pong", ts: ws.sent.at(-1).ts });
  const next = timers.shift();
  assert.ok(next.ms >= 5000, "the new ping's pong gets time to come");
  clock.now += next.ms;
  next.fn();
  assert.equal(client.state, "open");
  assert.equal(Fake.all.length, 1);
});

test("close() from a reconnecting state listener stops the client", async () => {
  const { client, timers, ws } = await opened();
  client.addEventListener("state", (e) => {
    if (e.detail.state === "reconnecting") client.close(); // the app gives up at once
  });
  ws.serverClose(1006);
  await tick();
  assert.equal(client.state, "closed");
  assert.equal(timers.length, 0, "no retry is armed");
  assert.equal(Fake.all.length, 1);
});

// -- 6. calls that ended while their handler ran -----------------------------------------------

test("a result for a call that ended meanwhile is reported, neither kept nor sent", async () => {
  const { client, ws } = await opened();
  let finish;
  client.registerTool({ name: "t" }, () => new Promise((resolve) => { finish = resolve; }));
  const executed = [];
  client.addEventListener("tool.executed", (e) => executed.push(e.detail));
  ws.serverSend(call("c1", { seq: 1 }));
  await tick();
  ws.serverSend({ type: "tool.done", seq: 2, run_id: "r", call_id: "c1", status: "timeout" });
  finish("late");
  await tick();
  assert.equal(executed.length, 1);
  assert.equal(executed[0].ended, true);
  assert.deepEqual(results(ws), []);
  assert.equal(client.results.size, 0);

  // A failed resume forgets the call while its handler runs.
  ws.serverSend(call("c2", { seq: 3 }));
  await tick();
  ws.serverSend({ type: "welcome", epoch: "F", last_seq: 0, resumed: false, resume_failed: "epoch_changed" });
  finish("late");
  await tick();
  assert.equal(executed[1].ended, true);
  assert.deepEqual(results(ws), []);
  assert.equal(client.results.size, 0);

  ws.serverSend(call("c3", { seq: 1 }));
  await tick();
  finish("on time");
  await tick();
  assert.equal(executed[2].ended, false);
  assert.deepEqual(results(ws).map((r) => r.output), ["on time"]);
});

test("a result holding half an emoji is sent well-formed (U+FFFD), as the server accepts it", async () => {
  const { client, ws } = await opened();
  const raw = [];
  const send = ws.send.bind(ws);
  ws.send = (text) => { raw.push(text); send(text); };
  const cut = "Hi 😀 there".slice(0, 4); // "Hi \ud83d": cut at a UTF-16 index
  client.registerTool({ name: "t" }, () => ({ text: cut, whole: "ok 😀", path: "C:\\ud83d",
                                               [`k${"😀".slice(1)}`]: 1 }));
  ws.serverSend(call("c1", { seq: 1 }));
  await tick();
  const [result] = results(ws);
  assert.deepEqual(result.output, { text: "Hi \uFFFD", whole: "ok 😀", path: "C:\\ud83d", "k\uFFFD": 1 });
  // The server (orjson) refuses the escape of a lone surrogate: "no low surrogate in string".
  assert.ok(!/(^|[^\\])(\\\\)*\\ud[89a-f]/i.test(raw.at(-1)), raw.at(-1));
  assert.equal(api.wellFormedJson(JSON.stringify(["\ud83d\ude00", "😀".slice(0, 1) + "x"])),
    '["😀","\\ufffdx"]');
});

test("stringifyWellFormed: the same JSON as wellFormedJson's scan, values, keys and look-alike text", () => {
  const half = "😀".slice(0, 1);
  const value = { text: `${"line \"q\"\n".repeat(2000)}Hi ${half}`, whole: "ok 😀", low: "😀".slice(1),
                  path: "C:\\ud83d", [`k${half}`]: [half, 1, null], nested: { deep: [`${half}x`] } };
  const fast = api.stringifyWellFormed(value);
  const scanned = api.wellFormedJson(JSON.stringify(value));
  assert.deepEqual(JSON.parse(fast), JSON.parse(scanned));
  assert.equal(JSON.parse(fast).text.at(-1), "\uFFFD");
  assert.equal(JSON.parse(fast).path, "C:\\ud83d");
  assert.ok(!/(^|[^\\])(\\\\)*\\ud[89a-f]/i.test(fast), "no escaped lone surrogate left");
  assert.ok(fast.isWellFormed());
  assert.equal(api.stringifyWellFormed({ a: "plain" }), '{"a":"plain"}');
});

// -- 7. state events and the clock ------------------------------------------------------------

test("one reconnecting state per retry, one closed state per close; tool.executed ms from `now`", async () => {
  const { client, timers, clock, states, ws } = await opened();
  client.registerTool({ name: "t" }, () => { clock.now += 42; return null; });
  const executed = [];
  client.addEventListener("tool.executed", (e) => executed.push(e.detail));
  ws.serverSend(call("c1", { seq: 1 }));
  await tick();
  assert.equal(executed[0].ms, 42);
  ws.serverClose(1011);
  timers.shift().fn();
  await tick();
  Fake.all[1].serverSend({ type: "welcome", epoch: "E", last_seq: 1, resumed: true });
  client.close();
  client.close();
  assert.deepEqual(states.map((s) => s.state), ["connecting", "open", "reconnecting", "open", "closed"]);
  assert.equal(states[2].code, 1011);
  assert.equal(states[2].delay, 125);
});

// -- 8. calls rebuilt from welcome.active_run --------------------------------------------------

test("after a resume, a pending call runs from its replayed tool.call, so the stale-call rule applies", async () => {
  const { client, timers, ws } = await opened();
  let ran = 0;
  client.registerTool({ name: "t" }, () => { ran += 1; return "edited"; });
  client.startRun({ prompt: "p", runId: "r", context: { document: { text: "hello", version: 1 } } });
  ws.serverSend({ type: "run.started", seq: 1, run_id: "r" });
  ws.serverClose(1006);
  client.editorChange({ documentVersion: 2, changes: [{ from: 0, to: 0, insert: 1 }] }); // meanwhile
  timers.shift().fn();
  await tick();
  const again = Fake.all[1];
  again.serverSend({ type: "welcome", epoch: "E", last_seq: 3, resumed: true, replayed: 2,
    active_run: { run_id: "r", client_id: "tab-1", pending: [
      { kind: "tool", call_id: "c1", name: "t", arguments: {}, token: "T", expires_at: 0 }] } });
  await tick();
  assert.equal(ran, 0, "not before the replay");
  again.serverSend({ type: "message.done", seq: 2, run_id: "r" });
  again.serverSend(call("c1", { seq: 3, document_version: 1 }));
  await tick();
  assert.equal(ran, 0, "the call was computed on version 1; the user edited since");
  assert.deepEqual(results(again).map((r) => r.error?.code), ["stale"]);

  // Without a replay to wait for (or once it is in), a call known only from active_run runs.
  again.serverSend({ type: "welcome", epoch: "E", last_seq: 3, resumed: true, replayed: 0,
    active_run: { run_id: "r", client_id: "tab-1", pending: [
      { kind: "tool", call_id: "c2", name: "t", arguments: {}, token: "T", expires_at: 0 }] } });
  await tick();
  assert.equal(ran, 1);
});

test("a replayed tool.call that timed out or was cancelled while the client was away is not run", async () => {
  const { client, timers, ws } = await opened();
  const ran = [];
  client.registerTool({ name: "t" }, (args, c) => { ran.push(c.call_id); return "edited"; });
  ws.serverSend({ type: "run.started", seq: 1, run_id: "r", client_id: "tab-1" });
  ws.serverClose(1006);
  timers.shift().fn();
  await tick();
  // Away for longer than the tool timeout: the run ended; no run is active now.
  const again = Fake.all[1];
  again.serverSend({ type: "welcome", epoch: "E", last_seq: 4, resumed: true, replayed: 3 });
  again.serverSend(call("c1", { seq: 2, document_version: 1 }));
  await tick();
  assert.deepEqual(ran, [], "held until the replay is in");
  again.serverSend({ type: "tool.done", seq: 3, run_id: "r", call_id: "c1", status: "timeout" });
  again.serverSend({ type: "run.finished", seq: 4, run_id: "r", status: "timed_out" });
  await tick();
  assert.deepEqual(ran, [], "its tool.done came in the replay");
  assert.deepEqual(results(again), []);
  assert.equal(client.executing.size, 0);

  // Cancelled from another tab: the replay ends with the call's tool.done; another run is active.
  again.serverClose(1006);
  timers.shift().fn();
  await tick();
  const third = Fake.all[2];
  third.serverSend({ type: "welcome", epoch: "E", last_seq: 8, resumed: true, replayed: 4,
    active_run: { run_id: "r2", client_id: "tab-2", pending: [] } });
  third.serverSend({ type: "run.started", seq: 5, run_id: "q", client_id: "tab-1" });
  third.serverSend(call("c2", { seq: 6, run_id: "q" }));
  third.serverSend({ type: "tool.done", seq: 7, run_id: "q", call_id: "c2", status: "cancelled" });
  third.serverSend({ type: "run.started", seq: 8, run_id: "r2", client_id: "tab-2" });
  await tick();
  assert.deepEqual(ran, []);
  assert.deepEqual(results(third), []);

  // A replayed call whose run finished in the replay without its own tool.done.
  third.serverClose(1006);
  timers.shift().fn();
  await tick();
  const fourth = Fake.all[3];
  fourth.serverSend({ type: "welcome", epoch: "E", last_seq: 10, resumed: true, replayed: 2 });
  fourth.serverSend(call("c3", { seq: 9, run_id: "q2" }));
  fourth.serverSend({ type: "run.finished", seq: 10, run_id: "q2", status: "cancelled" });
  await tick();
  assert.deepEqual(ran, []);

  // Live tool.calls after the replay run at once.
  fourth.serverSend(call("c4", { seq: 11 }));
  await tick();
  assert.deepEqual(ran, ["c4"]);
});

test("a replayed tool.call still pending in welcome.active_run runs once the replay is in", async () => {
  const { client, timers, ws } = await opened();
  const ran = [];
  client.registerTool({ name: "t" }, (args, c) => { ran.push([c.call_id, c.seq]); return "ok"; });
  ws.serverSend({ type: "run.started", seq: 1, run_id: "r", client_id: "tab-1" });
  ws.serverClose(1006);
  timers.shift().fn();
  await tick();
  const again = Fake.all[1];
  again.serverSend({ type: "welcome", epoch: "E", last_seq: 3, resumed: true, replayed: 2,
    active_run: { run_id: "r", client_id: "tab-1", pending: [
      { kind: "tool", call_id: "c1", name: "t", arguments: {}, token: "T", expires_at: 0 }] } });
  again.serverSend(call("c1", { seq: 2 }));
  await tick();
  assert.deepEqual(ran, []);
  again.serverSend({ type: "message.delta", seq: 3, run_id: "r", delta: "x" });
  await tick();
  assert.deepEqual(ran, [["c1", 2]], "run from its replayed tool.call, once");
  assert.deepEqual(results(again).map((r) => r.call_id), ["c1"]);
});

// -- 9. a run.start whose answer was lost ------------------------------------------------------

test("a run.start whose ack was lost keeps the run's scope; only the server's refusal forgets it", async () => {
  const { client, timers, ws } = await opened();
  const doc = { text: "hello", version: 1 };
  const started = client.startRun({ prompt: "p", runId: "r", context: { document: doc } });
  ws.serverClose(1012); // the ack is lost with the connection
  const error = await started.catch((e) => e);
  assert.equal(error.code, "connection_closed");
  assert.deepEqual([...client.runScopes.keys()], ["r"], "the run may be going: still protected");
  timers.shift().fn();
  await tick();
  const again = Fake.all[1];
  again.serverSend({ type: "welcome", epoch: "E", last_seq: 1, resumed: true, replayed: 1,
    active_run: { run_id: "r", client_id: "tab-1", pending: [] } });
  again.serverSend({ type: "run.started", seq: 1, run_id: "r", client_id: "tab-1" });
  assert.deepEqual([...client.runScopes.keys()], ["r"], "it is going");
  const retried = client.startRun({ prompt: "p", runId: "r", context: { document: doc } });
  again.serverSend({ type: "ack", reply_to: again.sent.at(-1).id, run_id: "r", status: "running",
                     duplicate: true });
  assert.equal((await retried).duplicate, true);
  assert.deepEqual([...client.runScopes.keys()], ["r"]);

  // Refused by the server: forgotten at once.
  const refused = client.startRun({ prompt: "p", runId: "busy", context: { document: doc } });
  again.serverSend({ type: "error", reply_to: again.sent.at(-1).id, code: "document_busy", message: "busy" });
  await assert.rejects(refused, /busy/);
  assert.deepEqual([...client.runScopes.keys()], ["r"]);

  // Lost on the way (the server never had it): forgotten once the next welcome's replay is in.
  const lost = client.startRun({ prompt: "p", runId: "lost", context: { document: doc } });
  again.serverClose(1006);
  assert.equal((await lost.catch((e) => e)).code, "connection_closed");
  timers.shift().fn();
  await tick();
  const third = Fake.all[2];
  third.serverSend({ type: "welcome", epoch: "E", last_seq: 2, resumed: true, replayed: 1,
    active_run: { run_id: "r", client_id: "tab-1", pending: [] } });
  assert.deepEqual([...client.runScopes.keys()], ["r", "lost"], "not before the replay is in");
  third.serverSend({ type: "message.delta", seq: 2, run_id: "r", delta: "x" });
  assert.deepEqual([...client.runScopes.keys()], ["r"]);

  // Retried after its run.finished came: the duplicate ack's status says it is over.
  third.serverSend({ type: "run.finished", seq: 3, run_id: "r", status: "completed" });
  const late = client.startRun({ prompt: "p", runId: "r", context: { document: doc } });
  third.serverSend({ type: "ack", reply_to: third.sent.at(-1).id, run_id: "r", status: "completed",
                     duplicate: true });
  await late;
  assert.deepEqual([...client.runScopes.keys()], []);
});

// -- 10. edits made while the connection is not open ----------------------------------------------

/** Ack each editor.change as it comes: one is in flight at most, the next goes on its answer. */
const drain = (ws) => {
  const sent = () => ws.sent.filter((m) => m.type === "editor.change");
  for (let n = 0; sent().length > n;) {
    n = sent().length;
    ws.serverSend({ type: "ack", reply_to: sent().at(-1).id });
  }
};

test("a kept edit too large to send goes without its summary; the client still opens", async () => {
  const { client, timers, ws } = await opened();
  ws.serverSend({ type: "welcome", epoch: "E", last_seq: 0, resumed: false,
                  limits: { max_message_bytes: 4096 } });
  ws.serverClose(1006);
  client.editorChange({ documentVersion: 2, summary: "x".repeat(5000) });
  client.editorChange({ origin: "agent", documentVersion: 3 });
  timers.shift().fn();
  await tick();
  const again = Fake.all.at(-1);
  again.serverSend({ type: "welcome", epoch: "E", last_seq: 0, resumed: true, replayed: 0,
                     limits: { max_message_bytes: 4096 } });
  assert.equal(client.state, "open"); // was: stuck in "reconnecting", the welcome unhandled
  drain(again);
  assert.deepEqual(editsSent(again), [
    { type: "editor.change", origin: "user", document_version: 2 },
    { type: "editor.change", origin: "agent", document_version: 3 },
  ]);
});

test("editorChange while reconnecting is kept and sent after the next welcome, before anything else", async () => {
  const { client, timers, ws } = await opened();
  ws.serverSend({ type: "welcome", epoch: "E", last_seq: 0, resumed: false, features: ["edit_scope"] });
  assert.equal(client.editorChange({ documentVersion: 1, changes: [{ from: 0, to: 0, insert: 1 }] }), true);
  ws.serverClose(1006); // the user types during a run while the page reconnects
  assert.equal(client.editorChange({ documentVersion: 2, summary: "typing",
                                     changes: [{ from: 1, to: 1, insert: 1 }] }), false);
  client.editorChange({ documentVersion: 3, summary: "typing", changes: [{ from: 2, to: 2, insert: 1 }] });
  client.editorChange({ origin: "agent", documentVersion: 4, changes: [] });
  client.editorChange({ documentVersion: 5 }); // no changes: it touches everything
  timers.shift().fn();
  await tick();
  const again = Fake.all[1];
  assert.deepEqual(again.sent.map((m) => m.type), ["hello"], "nothing before the welcome");
  let sentAtOpen = null;
  client.addEventListener("state", () => { sentAtOpen ??= again.sent.length; });
  again.serverSend({ type: "welcome", epoch: "E", last_seq: 0, resumed: true, replayed: 0,
                     features: ["edit_scope"] });
  drain(again);
  assert.deepEqual(editsSent(again), [
    // unanswered when the connection dropped: sent again first (the server applies it once)
    { type: "editor.change", origin: "user", document_version: 1,
      changes: [{ from: 0, to: 0, insert: 1 }] },
    { type: "editor.change", origin: "user", document_version: 3, summary: "typing",
      changes: [{ from: 1, to: 1, insert: 1 }, { from: 2, to: 2, insert: 1 }] },
    { type: "editor.change", origin: "agent", document_version: 4, changes: [] },
    { type: "editor.change", origin: "user", document_version: 5 },
  ]);
  assert.equal(sentAtOpen, 2, "sent before the open state's listeners send anything");
  assert.deepEqual(client.unsentEdits, []);
  assert.equal(client.editorChange({ documentVersion: 6 }), true);
});

// -- 10b. edits the server refused for a moment ---------------------------------------------------

const refuse = (ws, edit, code = "unavailable", retry_after_ms = 700) =>
  ws.serverSend({ type: "error", code, message: "retry shortly", reply_to: edit.id, retry_after_ms });
const edits = (ws) => ws.sent.filter((m) => m.type === "editor.change");

test("an edit refused unavailable is sent again as it was after retry_after_ms; later edits wait for it", async () => {
  const { client, timers, ws } = await opened();
  client.editorChange({ documentVersion: 2 });
  const [first] = edits(ws);
  refuse(ws, first);
  assert.equal(client.editorChange({ documentVersion: 3, summary: "typing" }), true, "open: it will go");
  client.editorChange({ documentVersion: 4 });
  assert.equal(edits(ws).length, 1, "nothing overtakes the refused edit");
  const retry = timers.shift();
  assert.equal(retry.ms, 700);
  retry.fn();
  assert.deepEqual(edits(ws), [first, first], "the same message, under the same id");
  refuse(ws, first); // still away
  timers.shift().fn();
  assert.equal(edits(ws).length, 3);
  ws.serverSend({ type: "ack", reply_to: first.id });
  const after = edits(ws).slice(3);
  assert.deepEqual(after.map(({ id, ...edit }) => edit),
                   [{ type: "editor.change", origin: "user", document_version: 4, summary: "typing" }],
                   "the edits made meanwhile, as one message, once the refused one is in");
  assert.notEqual(after[0].id, first.id);
  ws.serverSend({ type: "ack", reply_to: after[0].id });
  client.editorChange({ documentVersion: 5 });
  assert.equal(edits(ws).at(-1).document_version, 5, "then edits go at once again");
  assert.equal(timers.length, 0);
});

test("one editor.change is in flight at most: a later edit never overtakes a refused one", async () => {
  const { client, timers, ws } = await opened();
  client.editorChange({ documentVersion: 2 });
  client.editorChange({ origin: "agent", documentVersion: 3 }); // held: the first is unanswered
  const [first] = edits(ws);
  assert.equal(edits(ws).length, 1, "not pipelined");
  refuse(ws, first);
  client.editorChange({ documentVersion: 4 });
  assert.equal(edits(ws).length, 1, "held while the refused one waits");
  assert.equal(timers.length, 1, "one retry: the refused edit's");
  timers.shift().fn();
  assert.deepEqual(edits(ws).slice(1), [first], "the refused edit goes first");
  ws.serverSend({ type: "ack", reply_to: first.id });
  const second = edits(ws)[2];
  assert.deepEqual([second.origin, second.document_version], ["agent", 3], "then the next");
  refuse(ws, second, "rate_limited", 300);
  timers.shift().fn();
  assert.deepEqual(edits(ws)[3], second);
  ws.serverSend({ type: "ack", reply_to: second.id });
  assert.deepEqual(edits(ws).slice(4).map((m) => m.document_version), [4]);
});

/** The client's reports about held edits: edits.pending, edits.delivered, edit.dropped. */
const editReports = (client) => {
  const reports = [];
  for (const name of ["edits.pending", "edits.delivered", "edit.dropped"]) {
    client.addEventListener(name, (e) => reports.push({ name, ...e.detail }));
  }
  return reports;
};

test("an edit refused 15 times is sent until accepted, once, before the edits after it; the app is told", async () => {
  // It used to be given up after 10 sends (a Redis outage of ~10 s): the server never
  // learnt of the person's edit, the run went on, and nothing said so.
  const { client, timers, clock, ws } = await opened();
  const reports = editReports(client);
  clock.now = 1000;
  client.editorChange({ documentVersion: 2 });
  const [first] = edits(ws);
  client.editorChange({ documentVersion: 3 }); // held: the first is unanswered (one in flight)
  refuse(ws, first);
  client.editorChange({ documentVersion: 4 }); // merged with it: one message, version 4
  const waits = [];
  for (let refusal = 2; refusal <= 15; refusal += 1) {
    assert.equal(timers.length, 1, `after ${refusal - 1} refusals, a retry is scheduled`);
    const retry = timers.shift();
    waits.push(retry.ms);
    clock.now += retry.ms;
    retry.fn();
    // The server's wait is a floor: one long rate_limited wait is kept as it is.
    if (refusal === 12) refuse(ws, first, "rate_limited", 45_000);
    else refuse(ws, first);
  }
  assert.equal(timers.length, 1, "one retry is always scheduled: the edit is never given up");
  waits.push(timers[0].ms);
  assert.deepEqual(waits, [700, 1400, 2800, 5600, 11_200, 22_400, 30_000, 30_000, 30_000, 30_000,
                           30_000, 45_000, 30_000, 30_000, 30_000],
                   "the server's retry_after_ms, doubled while refusals go on, at most 30 s");
  assert.equal(edits(ws).length, 15, "nothing overtook it");
  clock.now += timers[0].ms;
  timers.shift().fn();
  assert.deepEqual(edits(ws), Array(16).fill(first), "the same message, under the same id, 16 times");
  const pending = reports.filter((r) => r.name === "edits.pending");
  assert.equal(pending.length, 15, "one report per refusal");
  assert.deepEqual(pending[0], { name: "edits.pending", count: 2, code: "unavailable", attempts: 1,
                                 retryInMs: 700, since: 1000 });
  assert.deepEqual(pending.map((r) => [r.attempts, r.code, r.count, r.since]).slice(10, 12),
                   [[11, "unavailable", 2, 1000], [12, "rate_limited", 2, 1000]]);
  assert.equal(pending.at(-1).retryInMs, 30_000);

  ws.serverSend({ type: "ack", reply_to: first.id }); // Redis is back
  const after = edits(ws).slice(16);
  assert.deepEqual(after.map((m) => m.document_version), [4], "then the edits made meanwhile, once");
  assert.equal(reports.length, 15, "not delivered yet: the edits after it are in flight");
  clock.now += 50;
  ws.serverSend({ type: "ack", reply_to: after[0].id });
  assert.deepEqual(reports.at(-1), { name: "edits.delivered", since: 1000, ms: clock.now - 1000,
                                     dropped: 0 });
  assert.equal(timers.length, 0);
  client.editorChange({ documentVersion: 5 });
  ws.serverSend({ type: "ack", reply_to: edits(ws).at(-1).id });
  assert.equal(reports.length, 16, "nothing more to report while edits go through");
});

test("an edit refused for good is dropped and reported; the next goes", async () => {
  const { client, timers, ws } = await opened();
  const reports = editReports(client);
  client.editorChange({ documentVersion: 2 });
  client.editorChange({ origin: "agent", documentVersion: 3 });
  const [first] = edits(ws);
  refuse(ws, first);
  timers.shift().fn();
  ws.serverSend({ type: "error", code: "invalid_message", message: "bad", reply_to: first.id });
  const [second] = edits(ws).slice(2);
  assert.deepEqual([second.origin, second.document_version], ["agent", 3]);
  assert.deepEqual(reports.map((r) => r.name), ["edits.pending", "edit.dropped"]);
  assert.deepEqual(JSON.parse(JSON.stringify(reports[1].message)), first, "the edit, as it was sent");
  assert.equal(reports[1].code, "invalid_message");
  assert.equal(reports[1].error.reply_to, first.id);
  ws.serverSend({ type: "ack", reply_to: second.id });
  assert.deepEqual(reports.at(-1), { name: "edits.delivered", since: 0, ms: 0, dropped: 1 },
                   "nothing waits any more; one of them never got in");

  // Refused for good at once (a viewer's edit): reported too, and nothing was pending.
  client.editorChange({ documentVersion: 4 });
  const third = edits(ws).at(-1);
  ws.serverSend({ type: "error", code: "forbidden", message: "viewer", reply_to: third.id });
  assert.deepEqual(reports.slice(3).map((r) => [r.name, r.code, r.message.id]),
                   [["edit.dropped", "forbidden", third.id]]);
});

test("a kept edit that cannot be sent at all is reported dropped, and the others go", async () => {
  const { client, timers, ws } = await opened();
  ws.serverSend({ type: "welcome", epoch: "E", last_seq: 0, resumed: false,
                  limits: { max_message_bytes: 4096 } });
  const reports = editReports(client);
  ws.serverClose(1006);
  client.editorChange({ documentVersion: "v".repeat(5000) }); // the app's version: far too long
  client.editorChange({ origin: "agent", documentVersion: 3 });
  timers.shift().fn();
  await tick();
  const again = Fake.all.at(-1);
  again.serverSend({ type: "welcome", epoch: "E", last_seq: 0, resumed: true, replayed: 0,
                     limits: { max_message_bytes: 4096 } });
  assert.equal(client.state, "open");
  drain(again);
  assert.deepEqual(editsSent(again), [{ type: "editor.change", origin: "agent", document_version: 3 }]);
  assert.deepEqual(reports.map((r) => [r.name, r.code, r.message.origin]),
                   [["edit.dropped", "too_large", "user"]]);
});

test("an edit refused before the connection dropped goes first after the next welcome, under its id", async () => {
  const { client, timers, ws } = await opened();
  const reports = editReports(client);
  client.editorChange({ documentVersion: 2 });
  const [first] = edits(ws);
  refuse(ws, first);
  ws.serverClose(1006);
  client.editorChange({ documentVersion: 3 });
  const reconnect = timers.findIndex((t) => t.ms !== 700);
  timers.splice(reconnect, 1)[0].fn();
  await tick();
  const again = Fake.all.at(-1);
  assert.deepEqual(edits(again), [], "nothing before the welcome");
  timers.shift().fn(); // the refusal's retry comes while the socket waits for its welcome
  assert.deepEqual(edits(again), [], "a frame before the welcome would close the connection");
  again.serverSend({ type: "welcome", epoch: "E", last_seq: 0, resumed: true, replayed: 0 });
  assert.deepEqual(edits(again), [first]);
  refuse(again, first); // still away: the wait goes on growing, under the same id
  assert.equal(timers.at(-1).ms, 1400);
  timers.pop().fn();
  assert.deepEqual(edits(again), [first, first]);
  again.serverSend({ type: "ack", reply_to: first.id });
  const [next] = edits(again).slice(2);
  assert.equal(next.document_version, 3);
  again.serverSend({ type: "ack", reply_to: next.id });
  assert.deepEqual(reports.map((r) => [r.name, r.attempts ?? r.dropped]),
                   [["edits.pending", 1], ["edits.pending", 2], ["edits.delivered", 0]]);
});

test("a client with no WebSocket or a baseUrl without a scheme throws at once", () => {
  // connect() used to return and the process died later ("this.WebSocketImpl is not a
  // constructor"), or the client stayed "connecting" for ever.
  const options = { baseUrl: "ws://server", documentId: "d", getToken: () => "t" };
  assert.throws(() => new CowriteClient({ ...options, WebSocketImpl: null,
                                          ...(globalThis.WebSocket ? { WebSocketImpl: 42 } : {}) }),
                /no WebSocket here: pass options\.WebSocketImpl/);
  assert.throws(() => new CowriteClient({ ...options, baseUrl: "127.0.0.1:8000", WebSocketImpl: Fake }),
                /baseUrl must be a ws:\/\/ or wss:\/\/ URL .*got "127\.0\.0\.1:8000"/);
});

test("a URL the WebSocket refuses closes the client with the reason, no retry", async () => {
  class Refusing {
    constructor(url) { throw new SyntaxError(`The URL's scheme must be either 'ws' or 'wss'. '${url}' is invalid.`); }
  }
  const { client, timers, states } = setup({ baseUrl: "localhost:8000", WebSocketImpl: Refusing });
  client.connect();
  await tick();
  await tick();
  assert.equal(client.state, "closed");
  assert.equal(states.at(-1).invalidUrl, true);
  assert.match(states.at(-1).reason, /^cannot open localhost:8000\/v1\/documents\/doc\/ws: The URL's scheme/);
  assert.equal(timers.length, 0); // no reconnect scheduled
});

