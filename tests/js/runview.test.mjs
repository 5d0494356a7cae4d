// The page's view of edit-aware and queued runs (runview.js) and the 1.1 scenarios,
// without a browser.
import { test } from "node:test";
import assert from "node:assert/strict";
import { ScopeTracker, scopeSegments, updateQueue } from "../../static/runview.js";
import { SCENARIOS, availableScenarios, firstParagraphEnd } from "../../static/scenarios.js";

test("scope highlight pieces: clamped, sorted, merged, empty ranges dropped", () => {
  assert.deepEqual(scopeSegments("Hello world", [{ from: 6, to: 11 }]),
    [{ text: "Hello ", mark: false }, { text: "world", mark: true }]);
  assert.deepEqual(scopeSegments("abcdef", [{ from: 4, to: 99 }, { from: 0, to: 2 }, { from: 1, to: 3 }]),
    [{ text: "abc", mark: true }, { text: "d", mark: false }, { text: "ef", mark: true }]);
  assert.deepEqual(scopeSegments("abc", [{ from: 1, to: 1 }]), [{ text: "abc", mark: false }]);
  assert.deepEqual(scopeSegments("abc", null), [{ text: "abc", mark: false }]);
  assert.deepEqual(scopeSegments("", []), [{ text: "", mark: false }]);
  for (const ranges of [[{ from: 2, to: 5 }], [{ from: 0, to: 9 }, { from: 3, to: 4 }]]) {
    assert.equal(scopeSegments("some text", ranges).map((p) => p.text).join(""), "some text");
  }
});

test("scope tracker: the server's scope, with this tab's later edits replayed on top", () => {
  const scope = new ScopeTracker();
  assert.equal(scope.current(), null, "no run, no highlight");
  scope.start("r1", [{ from: 10, to: 20 }], 1);
  scope.localEdit(2, [{ from: 0, to: 0, insert: 3 }]); // typed before the scope
  assert.deepEqual(scope.current(), [{ from: 13, to: 23 }], "moves at once, before the server answers");
  scope.localEdit(3, [{ from: 30, to: 30, insert: 1 }]); // after it
  scope.onScopeEvent({ type: "run.scope", run_id: "r1", scope: [{ from: 13, to: 23 }], document_version: 2 });
  assert.deepEqual(scope.current(), [{ from: 13, to: 23 }], "the server has v2; v3 is after the scope");
  scope.localEdit(4, [{ from: 13, to: 13, insert: 2 }], "agent");
  assert.deepEqual(scope.current(), [{ from: 15, to: 25 }], "an agent insertion at the start moves it");
  scope.localEdit(5, [{ from: 20, to: 21, insert: 4 }], "agent");
  assert.deepEqual(scope.current(), [{ from: 15, to: 28 }], "an agent edit inside grows it");
  scope.onScopeEvent({ type: "run.scope", run_id: "other", scope: [{ from: 0, to: 1 }], document_version: 5 });
  assert.deepEqual(scope.current(), [{ from: 15, to: 28 }], "another run's scope is not this one's");
  scope.localEdit(6, [{ from: 16, to: 17, insert: 0 }]);
  assert.equal(scope.current(), null, "a user edit inside: the scope can no longer be placed");
  scope.finish("r1");
  assert.equal(scope.runId, null);
  scope.onScopeEvent({ type: "run.scope", run_id: "r2", scope: [{ from: 1, to: 2 }], document_version: 9 });
  assert.deepEqual(scope.current(), [{ from: 1, to: 2 }], "another tab's run shows from its run.scope");
});

test("queue: welcome replaces it, run.queued adds in line, start and finish take runs out", () => {
  let queue = updateQueue([], { type: "welcome", queued_runs: [
    { run_id: "a", user_id: "u1", client_id: "t1", status: "queued" }] });
  assert.deepEqual(queue.map((r) => [r.run_id, r.position]), [["a", 1]]);
  queue = updateQueue(queue, { type: "run.queued", run_id: "b", user_id: "u2", client_id: "t2",
                               prompt: "p", position: 2 });
  queue = updateQueue(queue, { type: "run.queued", run_id: "b", user_id: "u2", client_id: "t2",
                               prompt: "p", position: 2 }); // replayed after a resume
  assert.deepEqual(queue.map((r) => r.run_id), ["a", "b"]);
  const same = updateQueue(queue, { type: "message.delta", run_id: "x" });
  assert.equal(same, queue, "other events leave it as it is");
  queue = updateQueue(queue, { type: "run.started", run_id: "a" });
  assert.deepEqual(queue.map((r) => r.run_id), ["b"]);
  queue = updateQueue(queue, { type: "run.finished", run_id: "b", status: "cancelled" });
  assert.deepEqual(queue, []);
  assert.deepEqual(updateQueue([{ run_id: "z" }], { type: "welcome" }), [], "a 1.0 welcome: none");
});

test("scenarios: the edit_scope and run_queue entries and what they send", () => {
  const ids = availableScenarios(SCENARIOS, ["edit_scope", "run_queue"]).map((s) => s.id);
  assert.ok(ids.includes("edit-scope") && ids.includes("queue"));
  const scoped = SCENARIOS.find((s) => s.id === "edit-scope").request({ text: "Title\nBody", version: 4 });
  assert.deepEqual(scoped.context.scope, [{ from: 0, to: 5 }]);
  assert.equal(scoped.options.on_edit, "overlap");
  assert.equal(scoped.context.document.version, 4);
  assert.equal(firstParagraphEnd("one line"), 8, "a one-line document is all scope");
  const queued = SCENARIOS.find((s) => s.id === "queue").request({ text: "", version: 0 });
  assert.equal(queued.options.if_busy, "enqueue");
});
