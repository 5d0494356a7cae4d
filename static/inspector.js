// The event inspector: every event received and message sent, as a table a
// protocol developer can read on a busy document. Filters by type and run,
// "replayed" badges on events that came from a resume, pause and follow,
// click a row for its JSON, copy one event or everything shown, and a summary
// per run. The model (records, filters, summaries) is in events.js.

import { bytes, clock, makeRecord, matches, shortRun, summarizeRuns } from "./events.js";

const KEEP = 5000; // records kept; older ones are dropped (the server's log has them all)
const SHOWN = 1500; // table rows kept in the DOM
const RUNS_SHOWN = 100; // rows of the run summary (the newest runs)

const $ = (id) => /** @type {HTMLElement} */ (document.getElementById(id));
const cell = (text, className) =>
  Object.assign(document.createElement("td"), { textContent: text, className: className ?? "" });

export class Inspector {
  constructor() {
    /** @type {import("./events.js").EventRecord[]} */ this.records = [];
    this.counter = 0;
    this.paused = false;
    this.unseen = 0;
    this.selected = null;
    this.lastShownAt = null;
    this.types = new Set();
    this.runs = new Set();
    /** @type {Map<string, number>} run_id -> records kept: a run's filter option goes with its last */
    this.perRun = new Map();
    this.summaryQueued = false;
    this.body = $("ins-rows");
    this.wrap = $("ins-wrap");
    for (const id of ["ins-type", "ins-run", "ins-sent"]) $(id).addEventListener("change", () => this.render());
    $("ins-pause").addEventListener("click", () => this.setPaused(!this.paused));
    $("ins-clear").addEventListener("click", () => this.clear());
    $("ins-copy").addEventListener("click", () => this.copy(this.selected ? [this.selected.event] : []));
    $("ins-copy-all").addEventListener("click",
      () => this.copy(this.records.filter((r) => matches(r, this.filter())).map((r) => r.event)));
    this.body.addEventListener("click", (e) => {
      const row = /** @type {HTMLElement} */ (e.target).closest("tr");
      if (row) this.select(Number(row.dataset.n));
    });
    // Scrolling up stops following (following only ever scrolls down); scrolling back to the
    // bottom does not restart it: the checkbox does.
    this.lastScrollTop = 0;
    this.wrap.addEventListener("scroll", () => {
      if (this.wrap.scrollTop < this.lastScrollTop - 4) $("ins-follow").checked = false;
      this.lastScrollTop = this.wrap.scrollTop;
    });
    $("ins-follow").addEventListener("change", () => this.#follow());
  }

  filter() {
    return { type: $("ins-type").value, run: $("ins-run").value, sent: $("ins-sent").checked };
  }

  /** Record one event (dir "in") or client message (dir "out"). */
  add(event, dir, replayed = false) {
    const record = makeRecord(event, { n: ++this.counter, dir, replayed });
    this.records.push(record);
    if (record.run) this.perRun.set(record.run, (this.perRun.get(record.run) ?? 0) + 1);
    if (this.records.length > KEEP) this.#forget(this.records.splice(0, this.records.length - KEEP));
    this.#option("ins-type", this.types, record.type, record.type);
    if (record.run) this.#option("ins-run", this.runs, record.run, shortRun(record.run));
    if (record.run) this.#queueSummary();
    if (this.paused) {
      this.unseen += 1;
      $("ins-pause").textContent = `Resume (${this.unseen} new)`;
    } else if (matches(record, this.filter())) {
      this.#append(record);
      this.#trim();
      this.#follow();
    }
    $("ins-count").textContent = `${this.records.length} events`;
  }

  setPaused(paused) {
    this.paused = paused;
    this.unseen = 0;
    $("ins-pause").textContent = paused ? "Resume" : "Pause";
    $("ins-pause").setAttribute("aria-pressed", String(paused));
    if (!paused) this.render();
  }

  clear() {
    this.#forget(this.records);
    this.records = [];
    this.selected = null;
    $("ins-json").textContent = "";
    $("ins-detail-title").textContent = "Click an event to see its JSON.";
    this.render();
    this.#renderSummary();
  }

  /** Rebuild the table from the records (after a filter change or a resume from pause). */
  render() {
    this.body.textContent = "";
    this.lastShownAt = null;
    this.lastScrollTop = 0; // the table shrank: not a scroll up
    const shown = this.records.filter((r) => matches(r, this.filter())).slice(-SHOWN);
    for (const record of shown) this.#append(record);
    this.#follow();
  }

  select(n) {
    const record = this.records.find((r) => r.n === n);
    if (!record) return;
    this.selected = record;
    for (const row of this.body.querySelectorAll("tr.selected")) row.classList.remove("selected");
    this.body.querySelector(`tr[data-n="${n}"]`)?.classList.add("selected");
    const where = record.dir === "out" ? "sent" : record.seq !== null ? `seq ${record.seq}` : "ephemeral";
    $("ins-detail-title").textContent =
      `${record.type} · ${where}${record.replayed ? " · replayed" : ""} · ${bytes(record.size)}`;
    $("ins-json").textContent = JSON.stringify(record.event, null, 2);
  }

  /** Copy events as pretty JSON (one object, or an array of them). */
  async copy(events) {
    if (events.length === 0) return;
    const text = JSON.stringify(events.length === 1 ? events[0] : events, null, 2);
    let done = false;
    try {
      await navigator.clipboard.writeText(text);
      done = true;
    } catch { // no clipboard API (an http:// page on a LAN address): the old way
      const area = Object.assign(document.createElement("textarea"), { value: text });
      document.body.append(area);
      area.select();
      done = document.execCommand("copy");
      area.remove();
    }
    $("ins-copied").textContent = done
      ? `copied ${events.length === 1 ? "1 event" : `${events.length} events`} as JSON`
      : "could not copy: select the JSON and copy it by hand";
  }

  #append(record) {
    const row = document.createElement("tr");
    row.dataset.n = String(record.n);
    row.className = `dir-${record.dir}${record.replayed ? " replayed" : ""}` +
      `${record === this.selected ? " selected" : ""}`;
    const delta = this.lastShownAt === null ? "" : `+${Math.max(0, record.at - this.lastShownAt)}`;
    this.lastShownAt = record.at;
    const type = cell(record.dir === "out" ? `↑ ${record.type}` : record.type, "type");
    if (record.replayed) {
      type.append(Object.assign(document.createElement("span"),
        { className: "badge replayed", textContent: "replayed" }));
    }
    row.append(cell(record.seq === null ? "–" : String(record.seq), "num"),
      cell(clock(record.at), `time${record.local ? " local" : ""}`), cell(delta, "num"), type,
      cell(shortRun(record.run), "run"), cell(bytes(record.size), "num"));
    if (record.run) row.lastChild.previousSibling.title = record.run;
    this.body.append(row);
  }

  #trim() {
    while (this.body.childElementCount > SHOWN) this.body.firstElementChild?.remove();
  }

  #follow() {
    if (!$("ins-follow").checked) return;
    this.wrap.scrollTop = this.wrap.scrollHeight;
    this.lastScrollTop = this.wrap.scrollTop;
  }

  #option(selectId, seen, value, label) {
    if (seen.has(value)) return;
    seen.add(value);
    const select = /** @type {HTMLSelectElement} */ ($(selectId));
    select.append(Object.assign(document.createElement("option"), { value, textContent: label }));
  }

  /** Records dropped: a run none of whose records is left leaves the run filter. */
  #forget(dropped) {
    for (const { run } of dropped) {
      if (!run) continue;
      const left = (this.perRun.get(run) ?? 1) - 1;
      if (left > 0) { this.perRun.set(run, left); continue; }
      this.perRun.delete(run);
      this.runs.delete(run);
      const select = /** @type {HTMLSelectElement} */ ($("ins-run"));
      const option = [...select.options].find((o) => o.value === run);
      if (option && select.value !== run) option.remove();
      else if (option) this.runs.add(run); // the filter shows it: keep it while chosen
    }
  }

  #queueSummary() {
    if (this.summaryQueued) return;
    this.summaryQueued = true;
    setTimeout(() => { this.summaryQueued = false; this.#renderSummary(); }, 50); // batched
  }

  #renderSummary() {
    const body = $("run-rows");
    body.textContent = "";
    const ms = (x) => (x === null ? "–" : `${Math.round(x)} ms`);
    for (const run of summarizeRuns(this.records).reverse().slice(0, RUNS_SHOWN)) {
      const row = document.createElement("tr");
      row.dataset.run = run.run_id;
      const tools = run.tools.calls === 0 ? "–"
        : `${run.tools.done}/${run.tools.calls} · avg ${ms(run.tools.avgMs)} · max ${ms(run.tools.maxMs)}`;
      const approvals = run.approvals.asked === 0 ? "–"
        : `${run.approvals.approved} approved, ${run.approvals.rejected} rejected · waited ${ms(run.approvals.waitMs)}`;
      row.append(cell(shortRun(run.run_id), "run"),
        cell(`${run.status}${run.reason ? ` (${run.reason})` : ""}`, `status-${run.status}`),
        cell(run.steps === null ? "–" : String(run.steps), "num"), cell(tools), cell(approvals),
        cell(ms(run.firstDeltaMs), "num"), cell(ms(run.totalMs), "num"),
        cell(`${run.events}${run.replayed ? ` (${run.replayed} replayed)` : ""}`, "num"));
      row.title = `${run.run_id}: click to show only this run's events`;
      row.addEventListener("click", () => {
        /** @type {HTMLSelectElement} */ ($("ins-run")).value = run.run_id;
        this.render();
      });
      body.append(row);
    }
  }
}
