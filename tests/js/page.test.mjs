// The test page's decisions without a browser: document ids, chips, settings,
// the inspector's records, filters and run summaries, scenario gating, and the
// demo's text keeping across reloads and tabs (with stand-ins for sessionStorage
// and BroadcastChannel, the browser APIs we do not own).
import { test } from "node:test";
import assert from "node:assert/strict";
import {
  approvalChip, documentIdProblem, finishChip, readSettings, suggestDocumentId,
} from "../../static/rules.js";
import { NOT_DELTAS, makeRecord, matches, summarizeRuns } from "../../static/events.js";
import { SCENARIOS, availableScenarios, judge } from "../../static/scenarios.js";
import { DocSync } from "../../static/docsync.js";
import { RunThreads, groupWorkflows, threadEntries, threadIdProblem } from "../../static/threads.js";

test("document ids: the server's rule, explained, with a suggestion", () => {
  for (const id of ["demo", "a.b_c:d-e", "x".repeat(128)]) assert.equal(documentIdProblem(id), null);
  assert.match(documentIdProblem("my notes"), /contains a space; use letters, digits and \. _ : - only/);
  assert.match(documentIdProblem("a/b?"), /contains “\/”, “\?”/);
  assert.match(documentIdProblem(""), /empty/);
  assert.match(documentIdProblem("x".repeat(129)), /129 characters long; the limit is 128/);
  assert.equal(suggestDocumentId("my notes"), "my-notes");
  assert.equal(suggestDocumentId("  été 2024 / plan "), "t-2024-plan");
  assert.equal(suggestDocumentId("???"), "demo");
  assert.equal(documentIdProblem(suggestDocumentId("x y".repeat(100))), null);
});

test("chips: approvals in the past tense, and only a completed run is done", () => {
  assert.equal(approvalChip("reject", "alice"), "rejected by alice");
  assert.equal(approvalChip("approve", "bob"), "approved by bob");
  assert.equal(finishChip("completed"), "→ done");
  assert.equal(finishChip("aborted"), "→ aborted");
  assert.equal(finishChip("cancelled"), "→ cancelled");
  assert.equal(finishChip("timed_out"), "→ timed out");
});

test("settings: URL, then this browser, then defaults", () => {
  const stored = (values) => ({ getItem: (key) => values[key] ?? null });
  const none = stored({});
  assert.deepEqual(readSettings(new URLSearchParams(""), none, () => "user-x"),
    { doc: "demo", user: "user-x", role: "editor", keepText: true });
  const saved = stored({ "cowrite.user": "sam", "cowrite.role": "viewer", "cowrite.keepText": "0" });
  assert.deepEqual(readSettings(new URLSearchParams(""), saved, () => "nope"),
    { doc: "demo", user: "sam", role: "viewer", keepText: false });
  assert.deepEqual(readSettings(new URLSearchParams("doc=d1&user=ann&role=editor&keep=1"), saved, () => ""),
    { doc: "d1", user: "ann", role: "editor", keepText: true });
  assert.equal(readSettings(new URLSearchParams("role=admin"), none, () => "u").role, "editor");
});

const run = "run_1";
const events = [
  { type: "welcome", last_seq: 0 },
  { type: "run.started", run_id: run, seq: 1, ts: 1000 },
  { type: "message.delta", run_id: run, message_id: "m1", delta: "He", seq: 2, ts: 1040 },
  { type: "message.delta", run_id: run, message_id: "m1", delta: "llo", seq: 3, ts: 1050 },
  { type: "message.done", run_id: run, message_id: "m1", text: "Hello", seq: 4, ts: 1060 },
  { type: "tool.call", run_id: run, call_id: "c1", seq: 5, ts: 1100 },
  { type: "tool.done", run_id: run, call_id: "c1", status: "ok", seq: 6, ts: 1130 },
  { type: "approval.requested", run_id: run, call_id: "c2", seq: 7, ts: 1200 },
  { type: "approval.resolved", run_id: run, call_id: "c2", decision: "reject", seq: 8, ts: 1700 },
  { type: "tool.done", run_id: run, call_id: "c2", status: "rejected", seq: 9, ts: 1700 },
  { type: "tool.call", run_id: run, call_id: "c3", seq: 10, ts: 1800 },
  { type: "tool.done", run_id: run, call_id: "c3", status: "ok", seq: 11, ts: 1890 },
  { type: "run.finished", run_id: run, status: "aborted", reason: "document_changed", steps: 3,
    seq: 12, ts: 2000 },
];
const records = events.map((event, i) =>
  makeRecord(event, { n: i + 1, dir: "in", replayed: (event.seq ?? 0) >= 10, now: 5 }));

test("records: server time for durable events, the browser's for the rest; size in bytes", () => {
  assert.equal(records[0].at, 5);
  assert.equal(records[0].local, true);
  assert.equal(records[1].at, 1000);
  assert.equal(records[1].seq, 1);
  assert.equal(records[1].run, run);
  assert.equal(records[2].size, new TextEncoder().encode(JSON.stringify(events[2])).length);
  const sent = makeRecord({ type: "run.start", run_id: run, ts: 9 }, { n: 99, dir: "out", now: 7 });
  assert.equal(sent.at, 7, "a client message's ts is not the server's clock");
  assert.equal(makeRecord({ type: "x", delta: "é" }, { n: 1, dir: "in" }).size, 25, "bytes, not characters");
});

test("filters: by type, all but deltas, by run, without sent messages", () => {
  const sent = makeRecord({ type: "run.start", run_id: "run_2" }, { n: 50, dir: "out" });
  const all = [...records, sent];
  const pick = (filter) => all.filter((r) => matches(r, filter)).map((r) => r.n);
  assert.equal(pick({}).length, all.length);
  assert.deepEqual(pick({ type: "message.delta" }), [3, 4]);
  assert.equal(pick({ type: NOT_DELTAS }).length, all.length - 2);
  assert.deepEqual(pick({ run: "run_2" }), [50]);
  assert.equal(pick({ sent: false }).length, all.length - 1);
  assert.deepEqual(pick({ type: "run.start", sent: false }), []);
});

test("run summary: steps, tool round trips, approvals and timings from server time", () => {
  const [summary] = summarizeRuns(records);
  assert.deepEqual(summary, {
    run_id: run, status: "aborted", reason: "document_changed", steps: 3, messages: 1, deltas: 2,
    events: 12, replayed: 3,
    tools: { calls: 2, done: 2, avgMs: 60, maxMs: 90 },
    approvals: { asked: 1, approved: 0, rejected: 1, waitMs: 500 },
    firstDeltaMs: 40, totalMs: 1000,
  });
  const running = summarizeRuns(records.slice(0, 4))[0];
  assert.equal(running.status, "running");
  assert.equal(running.totalMs, null);
  assert.equal(running.steps, null);
  assert.deepEqual(summarizeRuns([makeRecord({ type: "run.start", run_id: "r" }, { n: 1, dir: "out" })]),
    [], "sent messages are not the run's events");
});

test("scenarios: 1.1 entries appear only when welcome.features lists them", () => {
  const base = availableScenarios(SCENARIOS, undefined).map((s) => s.id);
  assert.deepEqual(base, ["stream", "client-tool", "approval", "abort", "cancel", "failure"]);
  const more = availableScenarios(SCENARIOS, ["edit_scope", "threads"]).map((s) => s.id);
  assert.deepEqual(more, [...base, "edit-scope", "thread"]);
  const noWorkflows = availableScenarios(SCENARIOS, ["workflows"], { workflows: [] });
  assert.deepEqual(noWorkflows.map((s) => s.id), base, "no workflow configured: the entry is hidden");
  const withOne = availableScenarios(SCENARIOS, ["workflows"], { workflows: ["tidy", "ask"] });
  const entry = withOne.find((s) => s.id === "workflow");
  assert.equal(entry.request({ text: "", version: 0 }, { workflow: "tidy" }).workflow, "tidy",
    "the first listed workflow, whatever its name");
  assert.equal(SCENARIOS.find((s) => s.id === "thread").request({ text: "", version: 0 }).threadId, "side");
  for (const s of SCENARIOS) {
    const request = s.request({ text: "Hello.\nWorld.", version: 3 }, { workflow: "w" });
    assert.equal(typeof request.prompt, "string", s.id);
    if (!s.requires) assert.ok(JSON.parse(request.prompt).script.length > 0, s.id);
  }
  const failure = SCENARIOS.find((s) => s.id === "failure");
  assert.ok(JSON.parse(failure.request({ text: "", version: 0 }).prompt).script[0].fail);
});

test("scenario verdicts", () => {
  const abort = SCENARIOS.find((s) => s.id === "abort");
  assert.deepEqual(judge(abort, { status: "aborted", reason: "document_changed" }),
    { ok: true, text: "ended aborted (document_changed), as expected" });
  assert.deepEqual(judge(abort, { status: "completed" }),
    { ok: false, text: "ended completed; expected aborted (document_changed)" });
});

class MemoryStorage {
  constructor() { this.items = new Map(); }
  getItem(key) { return this.items.get(key) ?? null; }
  setItem(key, value) { this.items.set(key, String(value)); }
  removeItem(key) { this.items.delete(key); }
}

/** BroadcastChannel within one process: delivers to every other channel of the same name. */
class FakeChannel {
  static open = [];
  constructor(name) { this.name = name; FakeChannel.open.push(this); }
  postMessage(data) {
    for (const other of FakeChannel.open) {
      if (other !== this && other.name === this.name) other.onmessage?.({ data: structuredClone(data) });
    }
  }
  close() { FakeChannel.open = FakeChannel.open.filter((c) => c !== this); }
}

function tab(name, { documentId = "doc", keep = true, storage = new MemoryStorage(), clock } = {}) {
  const seen = [];
  let now = 0;
  const sync = new DocSync({ documentId, tab: name, keep, storage, Channel: FakeChannel,
                             onRemote: (s) => seen.push(s), now: clock ?? (() => ++now) });
  return { sync, seen, storage };
}

test("text kept per document across a reload of the tab, unless the setting is off", () => {
  FakeChannel.open = [];
  const storage = new MemoryStorage();
  const first = tab("t1", { storage });
  assert.equal(first.sync.load(), null);
  first.sync.changed("edited", 4);
  first.sync.close();
  const reloaded = tab("t1", { storage });
  assert.deepEqual(reloaded.sync.load(), { text: "edited", version: 4, at: 1, tab: "t1" });
  assert.equal(tab("t1", { storage, documentId: "other" }).sync.load(), null, "per document");
  reloaded.sync.setKeep(false);
  assert.equal(tab("t1", { storage }).sync.load(), null, "off forgets");
  const off = tab("t2", { keep: false });
  off.sync.changed("x", 1);
  assert.equal(off.storage.getItem("cowrite.doc.doc"), null);
});

test("tabs share the text; a tab that opens asks; the newest change wins", () => {
  FakeChannel.open = [];
  let clock = 100;
  const now = () => clock;
  const a = tab("a", { clock: now });
  const b = tab("b", { clock: now });
  a.sync.changed("from a", 1);
  assert.deepEqual(b.seen.map((s) => s.text), ["from a"]);
  assert.equal(a.seen.length, 0, "a tab does not hear itself");

  const late = tab("c", { clock: now });
  late.sync.ask();
  assert.equal(late.seen.at(-1).text, "from a", "the late tab picks up the text");

  clock = 50; // an older change (a slow tab) loses
  const stale = { kind: "text", text: "old", version: 9, at: 50, tab: "z" };
  new FakeChannel("cowrite.doc.doc").postMessage(stale);
  assert.equal(b.seen.at(-1).text, "from a");
  const otherDoc = tab("d", { documentId: "elsewhere", clock: now });
  clock = 200;
  a.sync.changed("newer", 2);
  assert.equal(otherDoc.seen.length, 0, "other documents are not touched");
  assert.equal(b.seen.at(-1).text, "newer");
});

test("thread names: the server's rule, explained", () => {
  for (const name of ["main", "side", "a.b_c:d-e", "x".repeat(64)]) assert.equal(threadIdProblem(name), null);
  assert.match(threadIdProblem(""), /needs a name/);
  assert.match(threadIdProblem("my thread"), /letters, digits/);
  assert.match(threadIdProblem("x".repeat(65)), /65 characters long; the limit is 64/);
});

test("thread switcher: the server's threads, then the current one and main if new", () => {
  assert.deepEqual(threadEntries([], "main").map((t) => t.label), ["main · new"]);
  const known = [{ thread_id: "side", runs: 1, last_ts: 9 }, { thread_id: "main", runs: 3, last_ts: 5 }];
  assert.deepEqual(threadEntries(known, "side").map((t) => t.label), ["side · 1 run", "main · 3 runs"]);
  assert.deepEqual(threadEntries(known, "draft").map((t) => t.thread_id), ["side", "main", "draft"]);
});

test("runs of another thread fold; unknown runs count as the shown thread", () => {
  const runs = new RunThreads();
  runs.started({ run_id: "r1", thread_id: "side" });
  runs.started({ run_id: "r2" }); // a 1.0 server: main
  assert.equal(runs.isOther("r1", "main"), true);
  assert.equal(runs.isOther("r1", "side"), false);
  assert.equal(runs.isOther("r2", "main"), false);
  assert.equal(runs.isOther("r3", "main"), false);
  runs.markOther("r3");
  assert.equal(runs.isOther("r3", "main"), true);
  assert.equal(runs.name("r3"), "another thread");
  runs.markOther("r1");
  assert.equal(runs.name("r1"), "side", "a known thread is kept");
});

test("workflows menu: by category, alphabetical, uncategorised last", () => {
  const groups = groupWorkflows([
    { name: "a", category: "editing" }, { name: "b" }, { name: "c", category: "Chat" },
    { name: "d", category: "editing" }]);
  assert.deepEqual(groups.map((g) => [g.category, g.workflows.map((w) => w.name)]),
    [["Chat", ["c"]], ["editing", ["a", "d"]], ["other", ["b"]]]);
  assert.deepEqual(groupWorkflows([]), []);
});
