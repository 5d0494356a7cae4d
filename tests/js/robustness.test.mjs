// The test page's DOM-free parts that keep it working when things go wrong around it:
// the development token's cache (tokens.js), the client id of a duplicated tab
// (tabid.js) and the events that arrive while the history loads (backlog.js).
import { test } from "node:test";
import assert from "node:assert/strict";
import { TokenCache, keepTokenFresh, tokenExpiry } from "../../static/tokens.js";
import { claimTabId } from "../../static/tabid.js";
import { coveredByHistory } from "../../static/backlog.js";

const jwt = (claims) => `h.${Buffer.from(JSON.stringify(claims)).toString("base64url")}.s`;

test("token cache: reused while it has more than 30 s to live, forgotten on drop", async () => {
  assert.equal(tokenExpiry(jwt({ sub: "a", exp: 100 })), 100_000);
  assert.equal(tokenExpiry("not a jwt"), null);
  let clock = 0;
  let issued = 0;
  const cache = new TokenCache({ now: () => clock, fetchToken: async () => {
    issued += 1;
    return jwt({ sub: "a", exp: clock / 1000 + 3600 });
  } });
  const first = await cache.get();
  assert.equal(await cache.get(), first);
  assert.equal(issued, 1);
  clock = 3_571_000; // 29 s left: too close to its end
  await cache.get();
  assert.equal(issued, 2);
  cache.drop(); // the server refused it (4001): a new one
  await cache.get();
  assert.equal(issued, 3);
  await Promise.all([cache.get(), cache.get()]);
  assert.equal(issued, 3, "one request at a time");
});

test("token cache: replaced 30 s before it expires, or at half its life when shorter", async () => {
  let clock = 0;
  let ttl = 3600;
  const cache = new TokenCache({ now: () => clock, fetchToken: async () => jwt({ exp: ttl }) });
  assert.equal(cache.refreshDelay(), null);
  await cache.get();
  assert.equal(cache.refreshDelay(), 3_570_000);
  cache.drop();
  ttl = 5;
  await cache.get();
  assert.equal(cache.refreshDelay(), 2_500);
  assert.notEqual(await cache.get(), null);
});

test("keepTokenFresh: auth.refresh before expiry; a refused token is forgotten", async () => {
  let clock = 0;
  let issued = 0;
  const tokens = new TokenCache({ now: () => clock, fetchToken: async () => {
    issued += 1;
    return jwt({ exp: clock / 1000 + 3600 });
  } });
  const client = Object.assign(new EventTarget(), { state: "open", refreshed: [],
    refreshAuth(token) { this.refreshed.push(token); return Promise.resolve({ type: "ack" }); } });
  const timers = [];
  keepTokenFresh(client, tokens, { setTimer: (fn, ms) => timers.push({ fn, ms }), clearTimer: () => {} });
  const emit = (type, detail) => client.dispatchEvent(new CustomEvent(type, { detail }));
  const used = await tokens.get(); // the connection's
  emit("welcome", { resumed: false });
  assert.equal(timers.at(-1).ms, 3_570_000);
  clock = 3_570_000;
  await timers.at(-1).fn();
  assert.equal(client.refreshed.length, 1);
  assert.notEqual(client.refreshed[0], used);
  assert.equal(timers.at(-1).ms, 3_570_000, "the new token is refreshed in its turn");
  emit("error", { code: "invalid_token" });
  assert.equal(tokens.token, null);
  await tokens.get();
  emit("state", { state: "reconnecting", code: 4001, action: "reauth" });
  assert.equal(tokens.token, null);
  assert.equal(issued, 3);
});

class FakeChannel {
  static all = [];
  constructor(name) { Object.assign(this, { name, onmessage: null }); FakeChannel.all.push(this); }
  postMessage(data) {
    for (const other of FakeChannel.all) {
      if (other !== this && other.name === this.name) queueMicrotask(() => other.onmessage?.({ data }));
    }
  }
}

const store = (values = {}) => ({ getItem: (k) => values[k] ?? null, setItem: (k, v) => { values[k] = v; } });

test("tab id: kept across a reload, renewed in a duplicated tab", async () => {
  FakeChannel.all = [];
  let n = 0;
  const makeId = () => `tab-${++n}`;
  const first = store();
  const how = { makeId, Channel: FakeChannel, waitMs: 20 };
  assert.equal(await claimTabId({ storage: first, ...how }), "tab-1");
  const reloaded = store({ "cowrite.clientId": "tab-9" }); // nobody else has it
  assert.equal(await claimTabId({ storage: reloaded, ...how }), "tab-9");
  const duplicate = store({ "cowrite.clientId": "tab-1" }); // sessionStorage copied
  assert.equal(await claimTabId({ storage: duplicate, ...how }), "tab-2");
  assert.equal(duplicate.getItem("cowrite.clientId"), "tab-2");
  assert.equal(await claimTabId({ storage: store({ "cowrite.clientId": "tab-x" }), ...how, Channel: null }),
    "tab-x", "without BroadcastChannel: the stored id");
});

test("backlog: what the history already shows is drawn once", () => {
  const history = [
    { role: "user", content: "p1", run_id: "r1" },
    { role: "assistant", content: "Early.", run_id: "r1" },
    { role: "assistant", content: "Second.", run_id: "r1" },
    { role: "user", content: "p2", run_id: "r2" },
    { role: "assistant", content: "cut sho", run_id: "r2", interrupted: true },
  ];
  const events = [
    { type: "message.delta", run_id: "r1", message_id: "r1:m2", delta: "Sec" },
    { type: "message.done", run_id: "r1", message_id: "r1:m2", text: "Second." },
    { type: "message.delta", run_id: "r1", message_id: "r1:m3", delta: "Third" },
    { type: "message.done", run_id: "r1", message_id: "r1:m3", text: "Third." }, // not recorded yet
    { type: "run.started", run_id: "r2" },
    { type: "message.delta", run_id: "r2", message_id: "r2:m1", delta: "t sho" }, // began before
    { type: "run.started", run_id: "r3" },
    { type: "message.delta", run_id: "r3", message_id: "r3:m1", delta: "Gone" },
    { type: "message.discarded", run_id: "r3", message_id: "r3:m1" },
  ];
  const covered = coveredByHistory(history, events);
  assert.deepEqual([...covered.prompts].sort(), ["r1", "r2"]);
  assert.deepEqual([...covered.messages].sort(), ["r1:m2", "r2:m1"]);
  assert.deepEqual([...coveredByHistory([], events).messages], [], "an empty history shows nothing");
  // The same text twice: only the one the history has is covered.
  const twice = coveredByHistory([{ role: "assistant", content: "x", run_id: "r" }], [
    { type: "message.done", run_id: "r", message_id: "m2", text: "x" }]);
  assert.deepEqual([...twice.messages], ["m2"]);
});
