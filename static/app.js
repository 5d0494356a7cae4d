// The bundled test page, a developer console for the protocol: an editor with
// the editor tools (editor.js), the agent's transcript (transcript.js), the
// event inspector (inspector.js), a scenarios menu (scenarios.js), the thread
// switcher and workflows menu (conversation.js) and the settings (settings.js), wired to the
// server through the reusable client (client.js).
import { CowriteClient } from "/static/client.js";
import { ThreadSwitcher, WorkflowMenu } from "./conversation.js";
import { Editor } from "./editor.js";
import { Inspector } from "./inspector.js";
import { documentIdProblem, readSettings, suggestDocumentId } from "./rules.js";
import { ScopeTracker, scopeSegments, updateQueue } from "./runview.js";
import { SCENARIOS, availableScenarios, judge } from "./scenarios.js";
import { openSettings, reloadWith, setupSettingsDialog } from "./settings.js";
import { claimTabId } from "./tabid.js";
import { TokenCache, keepTokenFresh } from "./tokens.js";
import { Transcript } from "./transcript.js";

const $ = (id) => /** @type {any} */ (document.getElementById(id));
const randomName = (prefix, n) => `${prefix}${Math.random().toString(36).slice(2, 2 + n)}`;

// -- settings -----------------------------------------------------------------------------
const params = new URLSearchParams(location.search);
const settings = readSettings(params, localStorage, () => randomName("user-", 5));
localStorage.setItem("cowrite.user", settings.user);
$("doc-name").textContent = settings.doc;
$("who").textContent = `${settings.user} (${settings.role})`;
setupSettingsDialog(settings);

/** A message above the page with optional action buttons; null hides it. */
function banner(text, actions = []) {
  $("banner").hidden = text === null;
  $("banner-text").textContent = text ?? "";
  $("banner-actions").replaceChildren(...actions.map(([label, act]) =>
    Object.assign(document.createElement("button"), { type: "button", textContent: label, onclick: act })));
}

function setStatus(state, label) {
  $("status").dataset.state = state;
  $("status").querySelector("b").textContent = label;
}

const problem = documentIdProblem(settings.doc);
if (problem) {
  // The server would refuse the upgrade (HTTP 404) and the browser would only see close
  // 1006, so the page checks the id itself and never connects.
  const suggestion = suggestDocumentId(settings.doc);
  banner(`“${settings.doc}” cannot be opened: ${problem}.`, [
    [`Open “${suggestion}” instead`, () => reloadWith({ doc: suggestion })],
    ["Settings", () => openSettings(settings)],
  ]);
  setStatus("closed", "not connected");
  for (const id of ["prompt", "send", "mode", "editor"]) $(id).disabled = true;
  $("scenarios").hidden = true;
  $("workflows").hidden = true;
} else {
  // The client id is kept per tab (sessionStorage); a duplicated tab takes a new one.
  claimTabId({ storage: sessionStorage, makeId: () => randomName("tab-", 8) }).then(start);
}

function start(clientId) {
  $("who").textContent = `${settings.user} (${settings.role}) · ${clientId}`;
  // A token is reused while it has more than 30 s to live, forgotten when the server
  // refuses it (4001: expired, or signed by a server since restarted with a new dev
  // secret), and replaced on the open connection (auth.refresh) before it expires.
  const tokens = new TokenCache({ fetchToken: async () => {
    const response = await fetch("/v1/dev/token", {
      method: "POST", headers: { "content-type": "application/json" },
      body: JSON.stringify({ user: settings.user, docs: ["*"], role: settings.role }),
    });
    if (!response.ok) {
      // The client retries with backoff; the banner says why it keeps failing.
      banner(`Could not get a development token (POST /v1/dev/token answered HTTP ` +
        `${response.status}). The test page needs a server started with COWRITE_DEV=1 ` +
        "(make run sets it), opened from this machine.");
      throw new Error(`no dev token (HTTP ${response.status}); is COWRITE_DEV=1?`);
    }
    return (await response.json()).token;
  } });
  const getToken = () => tokens.get();

  const client = new CowriteClient({
    baseUrl: `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}`,
    documentId: settings.doc, getToken, clientId,
  });
  keepTokenFresh(client, tokens);
  const inspector = new Inspector();
  const send = client.send.bind(client); // record what this tab sends, for the inspector
  client.send = (message, expectReply = false) => {
    inspector.add(message, "out");
    return send(message, expectReply);
  };

  const viewer = settings.role === "viewer";
  let activeRun = null; // {run_id, user_id, client_id, status?}
  const transcript = new Transcript(client);
  const mine = (run) => Boolean(run) && run.user_id === client.welcome?.user_id;
  transcript.mayAnswer = (request) => activeRun?.run_id === request.run_id && mine(activeRun);
  transcript.answer = (request) => openApproval(request);
  const threads = new ThreadSwitcher({ documentId: settings.doc, getToken, onSwitch: () => loadHistory() });
  transcript.thread = () => threads.current;
  const workflows = new WorkflowMenu({ getToken, disabled: viewer, onLoad: () => renderScenarios() });
  const scope = new ScopeTracker();
  const editor = new Editor({
    client, documentId: settings.doc, tab: clientId, keepText: settings.keepText, readOnly: viewer,
    isRunActive: () => Boolean(activeRun),
    onRemoteText: () => renderScope(),
    onLocalEdit: (version, changes, origin) => { scope.localEdit(version, changes, origin); renderScope(); },
  });

  // -- the run's scope, highlighted behind the textarea (protocol 1.1, edit_scope) ----------
  function renderScope() {
    const ranges = scope.current();
    const backdrop = $("scope-backdrop");
    backdrop.replaceChildren(...scopeSegments(editor.text, ranges).map((piece) => piece.mark
      ? Object.assign(document.createElement("mark"), { textContent: piece.text })
      : document.createTextNode(piece.text)));
    backdrop.append("\n"); // a trailing newline in the textarea still gets its line
    backdrop.scrollTop = $("editor").scrollTop;
    $("scope-note").hidden = !ranges;
    $("scope-note").textContent = ranges
      ? `Highlighted: the scope of run ${scope.runId?.slice(0, 12)}… ` +
        ranges.map((r) => `[${r.from}, ${r.to})`).join(" ") : "";
  }
  $("editor").addEventListener("scroll", () => { $("scope-backdrop").scrollTop = $("editor").scrollTop; });
  client.addEventListener("run.scope", ({ detail }) => { scope.onScopeEvent(detail); renderScope(); });

  // -- queued runs (protocol 1.1, run_queue) ------------------------------------------------
  let queue = [];
  function renderQueue() {
    $("queue-box").hidden = queue.length === 0;
    $("queue").replaceChildren(...queue.map((run) => {
      const item = document.createElement("li");
      item.dataset.run = run.run_id;
      const who = run.client_id === clientId ? "this tab" : `${run.user_id} (${run.client_id})`;
      item.textContent = `${shortPrompt(run.prompt)} — ${who}, run ${run.run_id.slice(0, 12)}…`;
      if (run.user_id === client.welcome?.user_id) {
        item.append(Object.assign(document.createElement("button"), {
          type: "button", className: "secondary", textContent: "Cancel",
          onclick: () => client.cancelRun(run.run_id, "cancelled while queued")
            .catch((e) => transcript.notice(e.message, true)),
        }));
      }
      return item;
    }));
  }
  const shortPrompt = (prompt) => {
    if (typeof prompt !== "string") return "(queued run)";
    const text = prompt.startsWith("{") ? "scripted run" : prompt;
    return text.length > 60 ? `${text.slice(0, 60)}…` : text;
  };
  client.addEventListener("event", ({ detail }) => {
    const next = updateQueue(queue, detail);
    if (next !== queue) { queue = next; renderQueue(); }
  });
  if (viewer) {
    for (const id of ["prompt", "send", "mode"]) $(id).disabled = true;
    $("prompt").placeholder = "Viewers watch: the server refuses their run.start (forbidden).";
  }

  function setRunning(run) {
    activeRun = run;
    $("cancel").disabled = !run || run.user_id !== client.welcome?.user_id;
    $("send").disabled = viewer || (Boolean(run) && run.client_id !== clientId);
    $("run-state").textContent = run ? `run ${run.run_id.slice(0, 12)}… ${run.status ?? "running"}` : "";
  }

  // -- the inspector sees every event; a resumed welcome marks what it replays ------------
  let replayUpTo = 0;
  client.addEventListener("event", ({ detail }) => {
    if (detail.type === "welcome") replayUpTo = detail.resumed ? detail.last_seq : 0;
    inspector.add(detail, "in", typeof detail.seq === "number" && detail.seq <= replayUpTo);
  });

  client.addEventListener("run.started", ({ detail }) => setRunning(detail));
  client.addEventListener("run.finished", ({ detail }) => {
    threads.refresh(); // its thread's run count (a new thread's first run makes it known)
    if ($("approval").dataset.run === detail.run_id) closeApproval();
    scope.finish(detail.run_id);
    renderScope();
    const scenario = scenarioRuns.get(detail.run_id);
    scenarioRuns.delete(detail.run_id);
    if (scenario) {
      const verdict = judge(scenario, detail);
      showScenario(`${scenario.title}: ${verdict.text}`, verdict.ok ? "ok" : "bad");
    }
    if (activeRun && activeRun.run_id !== detail.run_id) return; // a queued run was cancelled
    setRunning(null);
  });
  client.addEventListener("approval.requested", ({ detail }) => {
    if (activeRun?.run_id === detail.run_id && mine(activeRun)) openApproval(detail);
  });
  for (const type of ["approval.resolved", "tool.done"]) { // answered elsewhere, or timed out
    client.addEventListener(type, ({ detail }) => {
      if ($("approval").dataset.call === detail.call_id) closeApproval();
    });
  }

  /**
   * The transcript from the history of the thread shown; events that arrive meanwhile
   * are drawn after it (transcript.js). A run active meanwhile whose prompt is not in
   * that history belongs to another thread (its snapshot does not say which), so its
   * events fold. `fresh`: after a welcome that did not resume.
   */
  function loadHistory(activeRunId = activeRun?.run_id, fresh = false) {
    return transcript.load(async () => {
      const response = await fetch(`/v1/documents/${encodeURIComponent(settings.doc)}/history` +
        threads.historyQuery(), { headers: { authorization: `Bearer ${await getToken()}` } });
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      return (await response.json()).messages ?? [];
    }, { activeRunId, fresh, threads: client.supports("threads") });
  }

  /** A welcome that did not resume: what this tab showed of runs other than the active one is stale. */
  function forgetLostRuns(welcome) {
    const active = welcome.active_run ?? null;
    const dialog = $("approval");
    const stillAsked = (active?.pending ?? []).some((item) => item.call_id === dialog.dataset.call);
    if (!stillAsked) closeApproval();
    if (scope.runId && scope.runId !== active?.run_id) { scope.finish(scope.runId); renderScope(); }
    for (const [runId, scenario] of scenarioRuns) {
      if (runId === active?.run_id) continue;
      scenarioRuns.delete(runId);
      if (welcome.resume_failed) {
        showScenario(`${scenario.title}: its end was not seen (the resume failed: ` +
          `${welcome.resume_failed}); run it again.`, "bad");
      }
    }
    transcript.forgetLostRuns(active);
  }

  client.addEventListener("welcome", ({ detail }) => {
    threads.enable(client.supports("threads"));
    workflows.enable(client.supports("workflows"));
    renderScenarios();
    $("scoped").disabled = viewer || !client.supports("edit_scope");
    if ($("scoped").disabled) $("scoped").checked = false;
    if (detail.resumed) return;
    // At once, not after the history: events that come meanwhile (run.finished,
    // approval.requested) act on the run as it is now.
    setRunning(detail.active_run ?? null);
    forgetLostRuns(detail);
    for (const item of detail.active_run?.pending ?? []) {
      if (item.kind === "approval" && mine(detail.active_run)) {
        openApproval({ ...item, run_id: detail.active_run.run_id });
      }
    }
    loadHistory(detail.active_run?.run_id, true);
  });

  client.addEventListener("state", ({ detail }) => {
    const labels = { open: detail.resumed ? "resumed" : "connected", connecting: "connecting…",
                     reconnecting: "reconnecting…", closed: "disconnected", idle: "offline" };
    setStatus(detail.state, labels[detail.state] ?? detail.state);
    $("status").title = detail.reason ? `${detail.code ?? ""} ${detail.reason}`.trim() : "";
    if (detail.state === "open") banner(null);
    if (detail.state === "closed" && detail.refused) {
      banner(`Could not connect: ${detail.reason}. The browser saw close 1006 before the ` +
        `WebSocket opened, ${detail.attempts} times in a row, so the page stopped trying. ` +
        "Check the server's log, COWRITE_ALLOWED_ORIGINS and the document id.",
        [["Try again", () => { banner(null); client.connect(); }]]);
    } else if (detail.state === "closed" && detail.code) {
      transcript.notice(`connection closed (${detail.code})`, true);
    }
  });

  // Edits the server refused for a moment (Redis away, rate limited) are sent again until
  // they get in, the banner says so meanwhile; one refused for good is said in the transcript.
  let editsBanner = false;
  client.addEventListener("edits.pending", ({ detail }) => {
    editsBanner = true;
    banner(`Your edits have not reached the server yet (${detail.code}, tried ` +
      `${detail.attempts}×); trying again in ${Math.ceil(detail.retryInMs / 1000)} s. Keep this tab open.`);
  });
  client.addEventListener("edits.delivered", () => {
    if (editsBanner) banner(null);
    editsBanner = false;
  });
  client.addEventListener("edit.dropped", ({ detail }) =>
    transcript.notice(`an edit was refused (${detail.code}): the server does not have it`, true));

  // -- prompt, cancel, approvals ----------------------------------------------------------
  /**
   * Start a run through the client (which keeps the scope for its stale-call rule).
   * `request` may carry raw 1.1 fields (context.scope, options.on_edit/if_busy), as the
   * scenarios do, or `scope`/`onEdit` as the "scoped run" checkbox does. The highlight
   * starts at once for a scoped run that starts; a queued one shows it from its first
   * run.scope event.
   */
  async function startRun(request, scenario = null) {
    const runId = randomName("run_", 12);
    if (scenario) scenarioRuns.set(runId, scenario);
    editor.flush("before a run"); // a late report of earlier typing would abort the new run
    transcript.startTiming(runId);
    const run = { runId, mode: "agent", threadId: threads.runThread(), ...request,
                  context: request.context ?? { document: { text: editor.text, version: editor.version } } };
    const ranges = run.scope ?? run.context.scope;
    if (ranges) scope.start(runId, ranges, editor.version);
    renderScope();
    try {
      let ack;
      for (;;) {
        try {
          ack = await client.startRun(run);
          break;
        } catch (error) {
          // The run.start went out and the connection closed before its answer: the run
          // may be going. Asked again with the same run id once connected, the server acks
          // it `duplicate` (or starts it, if it never arrived).
          if (error.code !== "connection_closed" || !(await reconnected())) throw error;
        }
      }
      if (ack.status === "queued") { scope.finish(runId); renderScope(); }
      return true;
    } catch (error) {
      transcript.notice(error.code === "too_large"
        ? `the request (prompt + document) is too large for a run: ${error.message}`
        : `could not start: ${error.message}`, true);
      transcript.stopTiming();
      scenarioRuns.delete(runId);
      scope.finish(runId);
      renderScope();
      return false;
    }
  }

  /** True at the client's next open state; false if it stops (closed) first. */
  function reconnected() {
    if (client.state === "open" || client.state === "closed") {
      return Promise.resolve(client.state === "open");
    }
    return new Promise((resolve) => {
      const listener = ({ detail }) => {
        if (detail.state !== "open" && detail.state !== "closed") return;
        client.removeEventListener("state", listener);
        resolve(detail.state === "open");
      };
      client.addEventListener("state", listener);
    });
  }

  /** The "scoped run" checkbox: the selection (if any) as the scope, on_edit "overlap". */
  function scopedRequest() {
    if (!$("scoped").checked) return {};
    const area = $("editor");
    const selected = area.selectionStart < area.selectionEnd;
    return { onEdit: "overlap", ...(selected ? { scope: [{ from: area.selectionStart, to: area.selectionEnd }] } : {}) };
  }

  $("prompt-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const prompt = $("prompt").value.trim();
    if (!prompt) return;
    const workflow = workflows.selected ? { workflow: workflows.selected.name } : {};
    if (await startRun({ prompt, mode: $("mode").value, ...workflow, ...scopedRequest() })) {
      $("prompt").value = "";
    }
  });
  $("prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.metaKey || event.ctrlKey)) $("prompt-form").requestSubmit();
  });
  $("cancel").addEventListener("click", () => {
    if (activeRun) {
      client.cancelRun(activeRun.run_id, "cancel button").catch((e) => transcript.notice(e.message, true));
    }
  });

  function closeApproval() {
    if ($("approval").open) $("approval").close();
  }

  function openApproval(request) {
    const dialog = $("approval");
    dialog.dataset.call = request.call_id;
    dialog.dataset.run = request.run_id;
    $("approval-name").textContent = request.name;
    $("approval-args").value = JSON.stringify(request.arguments, null, 2);
    $("approval-error").textContent = "";
    if (!dialog.open) dialog.showModal();
  }

  // Escape would close the dialog unanswered; its call's "Answer…" in the tool log reopens it.
  $("approval").addEventListener("cancel", (event) => event.preventDefault());

  $("approval").addEventListener("submit", async (event) => {
    event.preventDefault();
    const dialog = $("approval");
    const { run, call } = dialog.dataset;
    const choice = event.submitter?.value;
    try {
      if (choice === "reject") {
        await client.reject(run, call, "rejected in the dialog");
      } else {
        let args;
        try { args = JSON.parse($("approval-args").value); } catch (error) {
          $("approval-error").textContent = `arguments are not valid JSON: ${error.message}`;
          return;
        }
        await client.approve(run, call, { scope: choice === "approve-run" ? "run" : "call", arguments: args });
      }
      dialog.close();
    } catch (error) {
      $("approval-error").textContent = error.message;
    }
  });

  // -- scenarios ----------------------------------------------------------------------------
  const scenarioRuns = new Map(); // run_id -> scenario

  function showScenario(text, tone) {
    $("scenario-status").hidden = false;
    $("scenario-status").dataset.tone = tone;
    $("scenario-status").textContent = text;
  }

  /** The entries for what the server announced (welcome.features, 1.1) and lists. */
  function renderScenarios() {
    const features = client.welcome?.features;
    const server = { workflows: workflows.names };
    $("scenario-list").replaceChildren(...availableScenarios(SCENARIOS, features, server).map((scenario) => {
      const item = Object.assign(document.createElement("button"), { type: "button", className: "menu-item" });
      item.dataset.scenario = scenario.id;
      item.setAttribute("role", "menuitem");
      item.append(Object.assign(document.createElement("b"), { textContent: scenario.title }),
        Object.assign(document.createElement("span"), { textContent: scenario.what }));
      item.disabled = viewer;
      item.addEventListener("click", async () => {
        $("scenarios").open = false;
        const expected = `${scenario.expect.status}${scenario.expect.reason ? ` (${scenario.expect.reason})` : ""}`;
        showScenario(`${scenario.title}: ${scenario.todo ? `${scenario.todo} ` : ""}` +
                     `Expected end: ${expected}.`, "running");
        await startRun(scenario.request({ text: editor.text, version: editor.version },
          { workflow: workflows.names[0] }), scenario);
      });
      return item;
    }));
  }

  window.cowrite = { client, editor, inspector, scope, threads, workflows, tokens };
  client.connect();
}
