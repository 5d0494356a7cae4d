// The test page's settings dialog (user, role, document, keeping the text) and
// reloads with changed URL parameters; `settings` is what rules.js readSettings gave.
import { documentIdProblem } from "./rules.js";

const $ = (id) => /** @type {any} */ (document.getElementById(id));

export function reloadWith(changes) {
  const next = new URLSearchParams(location.search);
  for (const [key, value] of Object.entries(changes)) next.set(key, value);
  location.search = next.toString();
}

/** @param {{user: string, role: string, doc: string, keepText: boolean}} settings */
export function openSettings(settings) {
  $("set-user").value = settings.user;
  $("set-role").value = settings.role;
  $("set-doc").value = settings.doc;
  $("set-keep").checked = settings.keepText;
  $("set-doc-error").textContent = "";
  $("settings").showModal();
}

/** @param {{user: string, role: string, doc: string, keepText: boolean}} settings */
export function setupSettingsDialog(settings) {
  $("open-settings").addEventListener("click", () => openSettings(settings));
  $("set-doc").addEventListener("input", () => {
    $("set-doc-error").textContent = documentIdProblem($("set-doc").value.trim()) ?? "";
  });
  $("settings-form").addEventListener("submit", (event) => {
    if (event.submitter?.value !== "save") return;
    const doc = $("set-doc").value.trim();
    const user = $("set-user").value.trim();
    const problemText = documentIdProblem(doc);
    if (problemText || !user) {
      event.preventDefault();
      $("set-doc-error").textContent = problemText ?? "the user may not be empty";
      return;
    }
    const keep = $("set-keep").checked;
    localStorage.setItem("cowrite.keepText", keep ? "1" : "0");
    localStorage.setItem("cowrite.role", $("set-role").value);
    localStorage.setItem("cowrite.user", user);
    if (!keep) sessionStorage.removeItem(`cowrite.doc.${settings.doc}`);
    window.cowrite?.editor?.sync.setKeep(keep);
    settings.keepText = keep;
    const current = new URLSearchParams(location.search);
    if (current.has("keep")) { // the stored choice rules from now on
      current.delete("keep");
      history.replaceState(null, "", `?${current}`);
    }
    const next = { doc, user, role: $("set-role").value };
    if (next.doc !== settings.doc || next.user !== settings.user || next.role !== settings.role) {
      const search = new URLSearchParams(location.search);
      search.delete("keep");
      for (const [key, value] of Object.entries(next)) search.set(key, value);
      location.search = search.toString();
    }
  });
}
