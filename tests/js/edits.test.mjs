// edits.js (re-exported by client.js): diffChange, the scope arithmetic and the
// stale-call rule, held against edits of real strings; then the client using them
// against a fake WebSocket (the browser API is the edge we do not own).
import { test } from "node:test";
import assert from "node:assert/strict";
import {
  CowriteClient, applyChanges, changeOverlaps, diffChange, isStaleCall, shiftRange,
} from "../../static/client.js";

/** A small deterministic PRNG (mulberry32), so a failing case can be replayed. */
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
const int = (random, lo, hi) => lo + Math.floor(random() * (hi - lo + 1));
const replace = (text, { from, to }, inserted) => text.slice(0, from) + inserted + text.slice(to);

test("diffChange: the single changed range, with insert as a count of string units", () => {
  assert.equal(diffChange("same", "same"), null);
  assert.deepEqual(diffChange("Hello world", "Hello, world"), { from: 5, to: 5, insert: 1 });
  assert.deepEqual(diffChange("Hello world", "Hello"), { from: 5, to: 11, insert: 0 });
  assert.deepEqual(diffChange("abc", "aXYc"), { from: 1, to: 2, insert: 2 });
  assert.deepEqual(diffChange("", "new"), { from: 0, to: 0, insert: 3 });
  assert.deepEqual(diffChange("gone", ""), { from: 0, to: 4, insert: 0 });
});

test("diffChange: the cursor says where an ambiguous edit happened", () => {
  // "aa" -> "aaa": an "a" typed at 0, 1 or 2 gives the same text.
  assert.deepEqual(diffChange("aa", "aaa"), { from: 2, to: 2, insert: 1 }, "rightmost by default");
  assert.deepEqual(diffChange("aa", "aaa", 1), { from: 0, to: 0, insert: 1 });
  assert.deepEqual(diffChange("aa", "aaa", 2), { from: 1, to: 1, insert: 1 });
  // Backspace of the second "b" in "abbc" leaves the cursor at 2: the deleted unit is [2, 3)
  // by default, [1, 2) when the cursor says so.
  assert.deepEqual(diffChange("abbc", "abc", 1), { from: 1, to: 2, insert: 0 });
  assert.deepEqual(diffChange("abbc", "abc", 2), { from: 2, to: 3, insert: 0 });
});

test("diffChange never splits a surrogate pair", () => {
  assert.deepEqual(diffChange("a😀b", "a😃b"), { from: 1, to: 3, insert: 2 });
  assert.deepEqual(diffChange("😀", ""), { from: 0, to: 2, insert: 0 });
});

test("diffChange on random edits: applying it gives the new text; with the cursor, the real place", () => {
  const random = rng(7);
  const alphabet = ["a", "b", "a", "😀", "\n"];
  const word = (n) => Array.from({ length: n }, () => alphabet[int(random, 0, alphabet.length - 1)]).join("");
  for (let i = 0; i < 3000; i += 1) {
    const before = word(int(random, 0, 12));
    const from = int(random, 0, before.length);
    const to = int(random, from, Math.min(before.length, from + 4));
    const inserted = word(int(random, 0, 3));
    if (/[\udc00-\udfff]/.test(before[from] ?? "") || /[\udc00-\udfff]/.test(before[to] ?? "")) continue;
    const after = replace(before, { from, to }, inserted);
    const change = diffChange(before, after, from + inserted.length);
    if (before === after) { assert.equal(change, null); continue; }
    assert.equal(replace(before, change, after.slice(change.from, change.from + change.insert)), after,
      JSON.stringify({ before, after, change }));
    assert.ok(change.from >= 0 && change.from <= change.to && change.to <= before.length);
    // The diff may be smaller than the edit (shared letters), never outside it.
    assert.ok(change.from >= from && change.to <= to, JSON.stringify({ before, from, to, inserted, change }));
  }
});

test("scope rules of section 11, as the server has them", () => {
  const scope = { from: 10, to: 20 };
  assert.deepEqual(shiftRange(scope, { from: 2, to: 5, insert: 7 }), { from: 14, to: 24 });
  assert.deepEqual(shiftRange(scope, { from: 10, to: 10, insert: 4 }), { from: 14, to: 24 },
    "an insertion at the start goes before it");
  assert.deepEqual(shiftRange(scope, { from: 20, to: 20, insert: 4 }), scope,
    "an insertion at the end goes after it");
  assert.equal(changeOverlaps({ from: 12, to: 12, insert: 1 }, scope), true);
  assert.equal(changeOverlaps({ from: 15, to: 15, insert: 0 }, scope), false, "a no-op");
  assert.equal(changeOverlaps({ from: 5, to: 10, insert: 3 }, scope), false);
  assert.equal(changeOverlaps({ from: 5, to: 11, insert: 3 }, scope), true);
  assert.throws(() => shiftRange(scope, { from: 12, to: 13, insert: 0 }), RangeError);
  assert.deepEqual(applyChanges([scope], [{ from: 0, to: 0, insert: 5 }, { from: 12, to: 15, insert: 0 }]),
    [{ from: 12, to: 22 }]);
  assert.equal(applyChanges([scope], [{ from: 0, to: 5, insert: 0 }, { from: 5, to: 6, insert: 0 }]), null);
});

test("applyChanges agrees with editing a real string (the scoped text is where the ranges say)", () => {
  const random = rng(11);
  for (let i = 0; i < 3000; i += 1) {
    // Every unit is a distinct character, so where scoped text went is visible.
    let doc = Array.from({ length: int(random, 0, 20) }, (_, k) => String.fromCharCode(0x4e00 + k));
    const scope = [];
    for (let k = int(random, 0, 3); k > 0 && doc.length > 0; k -= 1) {
      const a = int(random, 0, doc.length - 1);
      scope.push({ from: a, to: int(random, a + 1, doc.length) });
    }
    const scoped = scope.map((r) => doc.slice(r.from, r.to).join(""));
    const members = scope.map((r) => new Set(doc.slice(r.from, r.to)));
    const changes = [];
    let touched = false;
    let fresh = 0x3400;
    for (let k = int(random, 0, 4); k > 0; k -= 1) {
      const from = int(random, 0, doc.length);
      const change = { from, to: int(random, from, Math.min(doc.length, from + 5)), insert: int(random, 0, 4) };
      for (const set of members) {
        const removed = doc.slice(change.from, change.to).some((u) => set.has(u));
        const between = change.from === change.to && change.insert > 0 &&
          set.has(doc[change.from - 1]) && set.has(doc[change.from]);
        if (removed || between) touched = true;
      }
      const inserted = Array.from({ length: change.insert }, () => String.fromCharCode(fresh++));
      doc = [...doc.slice(0, change.from), ...inserted, ...doc.slice(change.to)];
      changes.push(change);
    }
    const result = applyChanges(scope, changes);
    assert.equal(result === null, touched, JSON.stringify({ scope, changes }));
    if (result) result.forEach((r, k) => assert.equal(doc.slice(r.from, r.to).join(""), scoped[k]));
  }
});

const scope = [{ from: 10, to: 20 }];
const user = (version, changes) => ({ version, origin: "user", changes });
const agent = (version, changes) => ({ version, origin: "agent", changes });

test("stale-call rule: only an older call, and only a later user edit in the scope", () => {
  const base = { callVersion: 3, currentVersion: 5, scope, scopeVersion: 1 };
  const inside = user(4, [{ from: 12, to: 13, insert: 1 }]);
  const elsewhere = user(4, [{ from: 30, to: 30, insert: 2 }]);
  assert.equal(isStaleCall({ ...base, edits: [inside] }), true);
  assert.equal(isStaleCall({ ...base, edits: [elsewhere] }), false, "an edit outside the scope");
  assert.equal(isStaleCall({ ...base, callVersion: 5, edits: [inside] }), false, "not older");
  assert.equal(isStaleCall({ ...base, edits: [agent(4, [{ from: 12, to: 13, insert: 1 }])] }), false,
    "the run's own edits are never stale");
  assert.equal(isStaleCall({ ...base, edits: [user(3, [{ from: 0, to: 0, insert: 20 }]), inside] }), false,
    "an edit the call knew of moved the scope past the later one");
  assert.equal(isStaleCall({ ...base, edits: [user(2, [{ from: 0, to: 0, insert: 2 }]),
                                               user(4, [{ from: 21, to: 22, insert: 0 }])] }), true,
    "an earlier edit moved the scope onto the later one");
  assert.equal(isStaleCall({ ...base, edits: [user(4, null)] }), true, "unknown changes overlap everything");
  assert.equal(isStaleCall({ ...base, scope: null, edits: [elsewhere] }), true, "no scope: the whole document");
  assert.equal(isStaleCall({ ...base, scope: null, edits: [user(4, [{ from: 3, to: 3, insert: 0 }])] }), false,
    "a no-op changes nothing");
  assert.equal(isStaleCall({ ...base, callVersion: "v3", edits: [inside] }), false, "strings do not order");
  assert.equal(isStaleCall({ ...base, edits: [], complete: false }), true, "forgotten edits: refuse");
  assert.equal(isStaleCall({ ...base, edits: [agent(2, [{ from: 5, to: 5, insert: 10 }]), inside] }), false,
    "an agent insertion before the scope moved it away from the edit");
  assert.equal(isStaleCall({ ...base, edits: [agent(2, [{ from: 15, to: 15, insert: 10 }]),
                                               user(4, [{ from: 25, to: 26, insert: 0 }])] }), true,
    "an agent insertion inside the scope grew it");
});

// -- the client --------------------------------------------------------------------------------

class FakeSocket {
  static all = [];
  constructor() {
    Object.assign(this, { sent: [], readyState: 0 });
    FakeSocket.all.push(this);
    queueMicrotask(() => { this.readyState = 1; this.onopen?.(); });
  }
  send(text) { this.sent.push(JSON.parse(text)); }
  close(code = 1000) { this.readyState = 3; this.onclose?.({ code, reason: "" }); }
  serverSend(event) { this.onmessage?.({ data: JSON.stringify(event) }); }
}
const tick = () => new Promise((resolve) => setTimeout(resolve, 0));

async function connected(features) {
  FakeSocket.all = [];
  const client = new CowriteClient({ baseUrl: "ws://server", documentId: "d", getToken: () => "t",
                                     clientId: "tab-1", WebSocketImpl: FakeSocket, setTimeout: () => {} });
  client.connect();
  await tick();
  const ws = FakeSocket.all[0];
  ws.serverSend({ type: "welcome", epoch: "E", last_seq: 0, resumed: false, features });
  return { client, ws };
}

test("editorChange sends changes only to a server that supports edit_scope", async () => {
  const change = { from: 1, to: 2, insert: 3 };
  const old = await connected(undefined);
  old.client.editorChange({ documentVersion: 2, changes: [change] });
  const { id, ...sent } = old.ws.sent.at(-1);
  assert.equal(typeof id, "string");
  assert.deepEqual(sent, { type: "editor.change", origin: "user", document_version: 2 },
    "a 1.0 server would refuse the unknown field, and the edit would not abort the run");
  const next = await connected(["edit_scope"]);
  next.client.editorChange({ documentVersion: 2, changes: [change], summary: "typing" });
  const { id: _, ...withChanges } = next.ws.sent.at(-1);
  assert.deepEqual(withChanges, { type: "editor.change", origin: "user", document_version: 2,
                                  summary: "typing", changes: [change] });
  assert.equal(next.client.documentVersion, 2);
});

test("startRun: scope, onEdit and ifBusy become context.scope, options.on_edit, options.if_busy", async () => {
  const { client, ws } = await connected(["edit_scope", "run_queue"]);
  client.editorChange({ documentVersion: 7 });
  client.startRun({ prompt: "p", runId: "r1", scope: [{ from: 0, to: 4 }], onEdit: "overlap",
                    ifBusy: "enqueue", options: { max_steps: 3 },
                    context: { document: { text: "abcdef", version: 7 } } });
  const start = ws.sent.at(-1);
  assert.deepEqual(start.context, { document: { text: "abcdef", version: 7 }, scope: [{ from: 0, to: 4 }] });
  assert.deepEqual(start.options, { max_steps: 3, on_edit: "overlap", if_busy: "enqueue" });
  client.startRun({ prompt: "plain", runId: "r2" });
  assert.equal(ws.sent.at(-1).options, undefined, "nothing added when not asked");
  assert.equal(ws.sent.at(-1).context, undefined);
});

test("startRun refuses 1.1 options a server did not announce, and sends nothing", async () => {
  const { client, ws } = await connected(["edit_scope"]);
  const before = ws.sent.length;
  await assert.rejects(client.startRun({ prompt: "p", ifBusy: "enqueue" }),
    (error) => error.code === "unsupported" && /run_queue/.test(error.message));
  const old = await connected(undefined);
  await assert.rejects(old.client.startRun({ prompt: "p", scope: [] }), /edit_scope/);
  assert.equal(ws.sent.length, before);
});

test("a stale tool.call is answered with error code stale and its handler does not run", async () => {
  const { client, ws } = await connected(["edit_scope"]);
  let ran = 0;
  client.registerTool({ name: "insert_text" }, () => { ran += 1; return { ok: true }; });
  client.startRun({ prompt: "p", runId: "r", scope: [{ from: 10, to: 20 }], onEdit: "continue",
                    context: { document: { text: "x".repeat(30), version: 1 } } });
  const call = (callId, version) => ({ type: "tool.call", seq: 0, run_id: "r", call_id: callId,
    name: "insert_text", arguments: {}, executor: "client", client_id: "tab-1", token: "T",
    document_version: version });
  let seq = 0;
  const send = (event) => ws.serverSend({ ...event, seq: ++seq });

  client.editorChange({ documentVersion: 2, changes: [{ from: 25, to: 25, insert: 1 }] }); // outside
  send(call("c1", 1));
  await tick();
  assert.equal(ran, 1, "an edit outside the scope does not make the call stale");

  client.editorChange({ documentVersion: 3, changes: [{ from: 12, to: 14, insert: 0 }] }); // inside
  send(call("c2", 2));
  await tick();
  assert.equal(ran, 1, "the handler did not run");
  const refused = ws.sent.filter((m) => m.type === "tool.result").at(-1);
  assert.equal(refused.call_id, "c2");
  assert.equal(refused.error.code, "stale");
  assert.match(refused.error.message, /changed in this run's scope since version 2 \(now 3\)/);

  send(call("c3", 3));
  await tick();
  assert.equal(ran, 2, "a call computed on the current version runs");

  // run.scope moves the run's baseline: the server says the scope is now [20, 30) at v3.
  send({ type: "run.scope", run_id: "r", scope: [{ from: 20, to: 30 }], document_version: 3, user_id: "u" });
  client.editorChange({ documentVersion: 4, changes: [{ from: 12, to: 14, insert: 0 }] });
  send(call("c4", 3));
  await tick();
  assert.equal(ran, 3, "outside the scope the server reported");

  send({ type: "run.finished", run_id: "r", status: "completed", steps: 2 });
  assert.equal(client.edits.length, 0, "no run left to protect: the edit log is dropped");
});
