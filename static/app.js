// The bundled test page: an editor, a prompt box and the agent's side of the
// conversation, wired to the server through client.js. It doubles as the
// reference integration: the editor tools below are what an editor frontend
// declares and executes.
import { CowriteClient } from "/static/client.js";

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const documentId = params.get("doc") || "demo";
$("doc-id").value = documentId;
$("doc-id").addEventListener("change", (e) => {
  params.set("doc", e.target.value.trim() || "demo");
  location.search = params.toString();
});

const user = params.get("user") || localStorage.getItem("cowrite.user") ||
  `user-${Math.random().toString(36).slice(2, 7)}`;
localStorage.setItem("cowrite.user", user);
let clientId = sessionStorage.getItem("cowrite.clientId");
if (!clientId) {
  clientId = `tab-${Math.random().toString(36).slice(2, 10)}`;
  sessionStorage.setItem("cowrite.clientId", clientId);
}
$("who").textContent = `${user} · ${clientId}`;

let token = null;
async function getToken() {
  if (token) return token;
  const response = await fetch("/v1/dev/token", {
    method: "POST", headers: { "content-type": "application/json" },
    body: JSON.stringify({ user, docs: ["*"] }),
  });
  if (!response.ok) throw new Error(`no dev token (HTTP ${response.status}); is COWRITE_DEV=1?`);
  token = (await response.json()).token;
  return token;
}

const client = new CowriteClient({
  baseUrl: `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}`,
  documentId, getToken, clientId,
});

// -- the editor and its tools ----------------------------------------------------
const editor = $("editor");
let version = 0;
let activeRun = null; // {run_id, user_id, client_id}

function bumpVersion() {
  version += 1;
  $("doc-version").textContent = `v${version}`;
}

/** Apply an edit made by the agent: it is reported with origin "agent", never aborting. */
function agentEdit(text) {
  editor.value = text;
  bumpVersion();
  client.editorChange({ origin: "agent", documentVersion: version });
}

const objectOf = (properties, required = []) =>
  ({ type: "object", properties, required, additionalProperties: false });

client.registerTool({
  name: "read_document", description: "Read the whole document and its version.",
  parameters: objectOf({}),
}, () => ({ text: editor.value, version }));

client.registerTool({
  name: "get_selection", description: "The user's current selection (offsets and text).",
  parameters: objectOf({}),
}, () => ({ start: editor.selectionStart, end: editor.selectionEnd,
            text: editor.value.slice(editor.selectionStart, editor.selectionEnd) }));

client.registerTool({
  name: "insert_text", description: "Insert text at the start, the end or the cursor.",
  parameters: objectOf({ text: { type: "string" },
                         position: { enum: ["start", "end", "cursor"] } }, ["text"]),
}, ({ text, position = "end" }) => {
  const at = position === "start" ? 0 : position === "cursor" ? editor.selectionStart
    : editor.value.length;
  agentEdit(editor.value.slice(0, at) + text + editor.value.slice(at));
  return { inserted: text.length, at, version };
});

client.registerTool({
  name: "replace_text", description: "Find text and replace it (all occurrences if all=true).",
  parameters: objectOf({ find: { type: "string", minLength: 1 }, replace: { type: "string" },
                         all: { type: "boolean" } }, ["find", "replace"]),
}, ({ find, replace, all = false }) => {
  const count = editor.value.split(find).length - 1;
  if (count === 0) throw Object.assign(new Error(`"${find}" is not in the document`), { code: "not_found" });
  agentEdit(all ? editor.value.split(find).join(replace) : editor.value.replace(find, replace));
  return { replacements: all ? count : 1, version };
});

client.registerTool({
  name: "replace_document", description: "Replace the whole document.",
  requires_approval: true, parameters: objectOf({ text: { type: "string" } }, ["text"]),
}, ({ text }) => { agentEdit(text); return { length: text.length, version }; });

let changeTimer = null;
editor.addEventListener("input", () => {
  bumpVersion();
  clearTimeout(changeTimer);
  if (activeRun) { // the user edits during a run: abort it at once
    client.editorChange({ origin: "user", documentVersion: version, summary: "typing" });
  } else {
    changeTimer = setTimeout(() => client.editorChange({ origin: "user", documentVersion: version }), 300);
  }
});

// -- transcript, tool log, timings ---------------------------------------------------
const transcript = $("transcript");
const bubbles = new Map(); // message_id -> element
let thinking = null;
const timing = { submit: 0, started: 0, first: 0, tools: new Map() };

function add(kind, text) {
  const element = document.createElement("div");
  element.className = `msg ${kind}`;
  element.textContent = text;
  transcript.append(element);
  transcript.scrollTop = transcript.scrollHeight;
  return element;
}

function notice(text, bad = false) {
  add(`notice${bad ? " bad" : ""}`, text);
}

function showTiming(label, ms) {
  const chip = document.createElement("span");
  chip.textContent = `${label} ${ms.toFixed(0)} ms`;
  $("timings").append(chip);
}

function promptLabel(prompt) {
  try { if (JSON.parse(prompt).script) return "(scripted run)"; } catch { /* free text */ }
  return prompt;
}

function setRunning(run) {
  activeRun = run;
  $("cancel").disabled = !run || run.user_id !== client.welcome?.user_id;
  $("send").disabled = Boolean(run) && run.client_id !== clientId;
  $("run-state").textContent = run ? `run ${run.run_id.slice(0, 12)}… ${run.status ?? "running"}` : "";
}

function toolItem(callId) {
  let item = document.querySelector(`[data-call="${CSS.escape(callId)}"]`);
  if (!item) {
    item = document.createElement("li");
    item.dataset.call = callId;
    $("tool-log").append(item);
  }
  return item;
}

client.addEventListener("run.started", ({ detail }) => {
  add("user", promptLabel(detail.prompt));
  thinking = add("assistant thinking", "thinking");
  setRunning(detail);
  if (detail.client_id === clientId && timing.submit) {
    timing.started = performance.now();
    showTiming("→ run.started", timing.started - timing.submit);
  }
});

client.addEventListener("message.delta", ({ detail }) => {
  let bubble = bubbles.get(detail.message_id);
  if (!bubble) {
    if (thinking) { thinking.remove(); thinking = null; }
    bubble = add("assistant", "");
    bubbles.set(detail.message_id, bubble);
    if (timing.submit && !timing.first) {
      timing.first = performance.now();
      showTiming("→ first delta", timing.first - timing.submit);
    }
  }
  bubble.textContent += detail.delta;
  transcript.scrollTop = transcript.scrollHeight;
});

client.addEventListener("message.done", ({ detail }) => {
  const bubble = bubbles.get(detail.message_id) ?? add("assistant", "");
  bubble.textContent = detail.text;
  bubbles.set(detail.message_id, bubble);
});

client.addEventListener("tool.call", ({ detail }) => {
  if (thinking) { thinking.remove(); thinking = null; }
  timing.tools.set(detail.call_id, performance.now());
  toolItem(detail.call_id).innerHTML = "";
  toolItem(detail.call_id).append(`${detail.name}(${JSON.stringify(detail.arguments).slice(0, 120)}) `,
    Object.assign(document.createElement("b"), { textContent: `→ ${detail.executor}…` }));
});

client.addEventListener("approval.requested", ({ detail }) => {
  toolItem(detail.call_id).textContent = `${detail.name} awaits approval`;
  if (activeRun && activeRun.user_id === client.welcome?.user_id) openApproval(detail);
});

client.addEventListener("approval.resolved", ({ detail }) => {
  toolItem(detail.call_id).textContent += ` · ${detail.decision}d by ${detail.user_id}`;
  if ($("approval").dataset.call === detail.call_id && $("approval").open) $("approval").close();
});

client.addEventListener("tool.done", ({ detail }) => {
  const item = toolItem(detail.call_id);
  const status = Object.assign(document.createElement("b"), {
    className: `status-${detail.status}`, textContent: ` ${detail.status}` });
  item.querySelector("b")?.remove();
  item.append(status);
  const started = timing.tools.get(detail.call_id);
  if (started) showTiming(`tool ${detail.call_id.slice(-4)}`, performance.now() - started);
});

client.addEventListener("run.finished", ({ detail }) => {
  if (thinking) { thinking.remove(); thinking = null; }
  if ($("approval").open) $("approval").close();
  const bad = detail.status !== "completed";
  notice(`run ${detail.status}${detail.reason ? ` (${detail.reason})` : ""}` +
         `${detail.error ? `: ${detail.error.message}` : ""} · ${detail.steps} model call(s)`, bad);
  if (timing.submit) showTiming("→ done", performance.now() - timing.submit);
  timing.submit = 0;
  setRunning(null);
});

client.addEventListener("document.changed", ({ detail }) => {
  if (detail.client_id !== clientId && detail.origin === "user") {
    notice(`${detail.user_id} edited the document`);
  }
});

client.addEventListener("error", ({ detail }) => notice(`error ${detail.code}: ${detail.message}`, true));

client.addEventListener("event", ({ detail }) => {
  const raw = $("raw");
  raw.textContent += `${JSON.stringify(detail)}\n`;
  if (raw.textContent.length > 200_000) raw.textContent = raw.textContent.slice(-150_000);
});

client.addEventListener("welcome", async ({ detail }) => {
  if (detail.resumed) return;
  // A fresh start (or a lost resume): rebuild from the history, then the active run.
  transcript.textContent = "";
  bubbles.clear();
  try {
    const response = await fetch(`/v1/documents/${encodeURIComponent(documentId)}/history`,
      { headers: { authorization: `Bearer ${await getToken()}` } });
    for (const m of (await response.json()).messages ?? []) {
      if (m.role === "user") add("user", promptLabel(m.content));
      else if (m.role === "assistant") add("assistant", m.content + (m.interrupted ? " …(interrupted)" : ""));
    }
  } catch (error) {
    notice(`could not load the history: ${error}`, true);
  }
  setRunning(detail.active_run ?? null);
  for (const item of detail.active_run?.pending ?? []) {
    if (item.kind === "approval" && detail.active_run.user_id === detail.user_id) {
      openApproval({ ...item, run_id: detail.active_run.run_id });
    }
  }
});

client.addEventListener("state", ({ detail }) => {
  const labels = { open: detail.resumed ? "resumed" : "connected", connecting: "connecting…",
                   reconnecting: "reconnecting…", closed: "disconnected", idle: "offline" };
  $("status").dataset.state = detail.state;
  $("status").querySelector("b").textContent = labels[detail.state] ?? detail.state;
  if (detail.state === "closed" && detail.code) notice(`connection closed (${detail.code})`, true);
});

// -- prompt, cancel, approvals ----------------------------------------------------
$("prompt-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const prompt = $("prompt").value.trim();
  if (!prompt) return;
  $("timings").textContent = "";
  Object.assign(timing, { submit: performance.now(), started: 0, first: 0 });
  timing.tools.clear();
  try {
    await client.startRun({
      prompt, mode: $("mode").value,
      context: { document: { text: editor.value, version } },
    });
    $("prompt").value = "";
  } catch (error) {
    notice(`could not start: ${error.message}`, true);
    timing.submit = 0;
  }
});

$("prompt").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && (event.metaKey || event.ctrlKey)) $("prompt-form").requestSubmit();
});

$("cancel").addEventListener("click", () => {
  if (activeRun) client.cancelRun(activeRun.run_id, "cancel button").catch((e) => notice(e.message, true));
});

function openApproval(request) {
  const dialog = $("approval");
  dialog.dataset.call = request.call_id;
  dialog.dataset.run = request.run_id;
  $("approval-name").textContent = request.name;
  $("approval-args").value = JSON.stringify(request.arguments, null, 2);
  $("approval-error").textContent = "";
  if (!dialog.open) dialog.showModal();
}

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

window.cowrite = { client, editor };
client.connect();
