// Repository index: live filter by name and state, load/unload buttons that call the model
// repository API (POST /v2/repository/models/{m}/load|unload, the very requests tritonclient
// sends) and update the model's rows in place, and a refresh every few seconds.
// The buttons exist only when model control is explicit (<table data-controls> is "open" or
// "token"); with "token" they stay hidden until the repository API has taken the access token.
import { TOKEN_EVENT, announce, repositoryAccepts } from "./access.js";
import { accessToken, el, forgetAccessToken, getJSON, poll, readError, withToken } from "./common.js";
import { downloadBar } from "./download.js";

const busy = new Set();
let table, nameInput, stateSelect, shownLabel, emptyBody;
let lastRows = [];
let controls = "none";
let allowed = false;

/** Show the buttons when this viewer may use them, hide them otherwise. */
function applyControls() {
  for (const button of table.querySelectorAll("button[data-action]")) button.hidden = !allowed;
}

async function checkControls() {
  allowed = controls === "open" || (controls === "token" && Boolean(accessToken()) && (await repositoryAccepts()));
  applyControls();
}

export function initIndex() {
  table = document.getElementById("model-index");
  if (!table) return;
  nameInput = document.querySelector('[data-filter="name"]');
  stateSelect = document.querySelector('[data-filter="state"]');
  shownLabel = document.querySelector('[data-bind="shown"]');
  for (const body of table.tBodies) if (!body.dataset.model) body.remove();
  emptyBody = el("tbody", { hidden: true },
    el("tr", {}, el("td", { colspan: 6, class: "muted", text: "No model matches this filter." })));
  table.append(emptyBody);
  controls = table.dataset.controls || "none";
  for (const button of table.querySelectorAll("button[data-action]")) button.disabled = false;
  for (const button of table.querySelectorAll("button[data-action]")) button.removeAttribute("title");
  if (controls === "token") document.addEventListener(TOKEN_EVENT, checkControls);
  checkControls();
  table.addEventListener("click", (event) => {
    const button = event.target.closest("button[data-action]");
    if (button && !button.disabled) act(button.dataset.model, button.dataset.action);
  });
  const form = nameInput.form;
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    applyFilter();
  });
  nameInput.addEventListener("input", applyFilter);
  stateSelect.addEventListener("change", applyFilter);
  refresh();
  poll(refresh, 3000);
}

async function refresh() {
  const rows = await getJSON("/dashboard/api/models");
  if (rows) render(rows);
}

function render(rows) {
  lastRows = rows;
  const groups = new Map();
  for (const row of rows) {
    if (!groups.has(row.name)) groups.set(row.name, []);
    groups.get(row.name).push(row);
  }
  const existing = new Map([...table.tBodies].filter((b) => b.dataset.model).map((b) => [b.dataset.model, b]));
  const order = [];
  for (const [name, versions] of groups) {
    const body = existing.get(name) || newBody(name);
    updateBody(body, versions);
    order.push(body);
    existing.delete(name);
  }
  for (const gone of existing.values()) gone.remove();
  const current = [...table.tBodies].filter((b) => b.dataset.model);
  if (order.some((body, i) => current[i] !== body)) {
    for (const body of order) table.insertBefore(body, emptyBody);
  }
  applyFilter();
}

function newBody(name) {
  const url = `/models/${encodeURIComponent(name)}`;
  const button = (action, label, extra = "") =>
    el("button", { type: "button", class: `btn small ${extra}`, dataset: { action, model: name }, text: label,
      hidden: !allowed });
  return el("tbody", { dataset: { model: name } },
    el("tr", { class: "model-head" },
      el("th", { scope: "rowgroup", colspan: 6 },
        el("div", { class: "model-head-inner" },
          el("a", { class: "model-link", href: url, text: name }),
          el("span", { class: "badge", dataset: { bind: "model-state" } }),
          el("span", { class: "tag", dataset: { bind: "memory" }, hidden: true,
            title: "load: onDemand, and the resident memory its load took" }),
          el("span", { class: "actions" },
            el("a", { class: "btn small", href: `${url}/try`, text: "Try it" }),
            controls === "none" ? null : [button("load", "Load"), button("unload", "Unload", "danger")]),
          el("span", { class: "action-msg", role: "status", "aria-live": "polite" })))));
}

function updateBody(body, versions) {
  const name = body.dataset.model;
  const isBusy = busy.has(name);
  for (const button of body.querySelectorAll("button[data-action]")) button.disabled = isBusy;
  body.toggleAttribute("aria-busy", isBusy);
  // A click before the first refresh has answered (a slow server) knows no rows yet: the
  // server-rendered ones stay until it does.
  if (versions.length === 0) return;
  const state = versions[0].model_state;
  const badge = body.querySelector('[data-bind="model-state"]');
  if (!isBusy) {
    badge.textContent = state;
    badge.className = `badge state-${state.toLowerCase()}${versions[0].model_failed ? " failed" : ""}`;
  }
  const memory = body.querySelector('[data-bind="memory"]');
  memory.textContent = versions[0].memory || "";
  memory.hidden = !versions[0].memory;
  const load = body.querySelector('[data-action="load"]');
  if (load) load.textContent = state === "READY" ? "Reload" : "Load";
  const signature = JSON.stringify(versions);
  if (body.dataset.signature === signature) return;
  body.dataset.signature = signature;
  for (const row of [...body.rows].slice(1)) row.remove();
  body.append(...versions.map(versionRow));
}

function versionRow(r) {
  const failed = r.failed ? " failed" : "";
  return el("tr", { dataset: { version: r.version, state: r.state } },
    el("td", { dataset: { label: "Version" } }, el("span", {}, r.version || "—",
      r.serves_unversioned ? [" ", el("span", { class: "tag", title: "answers requests that name no version", text: "default" })] : null)),
    el("td", { dataset: { label: "State" } },
      el("span", { class: `badge state-${r.state.toLowerCase()}${failed}`, dataset: { col: "state" }, text: r.state })),
    el("td", { class: "reason", dataset: { label: "Reason", col: "reason" } }, r.reason, downloadBar(r)),
    el("td", { dataset: { label: "Runtime" }, text: r.runtime }),
    el("td", { dataset: { label: "Format" }, text: r.format }),
    el("td", { dataset: { label: "Platform", col: "platform" }, text: r.platform || "—" }));
}

function applyFilter() {
  const text = nameInput.value.trim().toLowerCase();
  const state = stateSelect.value;
  let shown = 0;
  let total = 0;
  for (const body of table.tBodies) {
    if (!body.dataset.model) continue;
    let visible = 0;
    for (const row of [...body.rows].slice(1)) {
      total += 1;
      const show = body.dataset.model.toLowerCase().includes(text) && (!state || row.dataset.state === state);
      row.hidden = !show;
      visible += show ? 1 : 0;
    }
    body.hidden = visible === 0;
    shown += visible;
  }
  emptyBody.hidden = shown > 0;
  if (shownLabel) shownLabel.textContent = `${shown} of ${total} versions`;
  const params = new URLSearchParams();
  if (text) params.set("q", nameInput.value.trim());
  if (state) params.set("state", state);
  const query = params.toString();
  history.replaceState(null, "", query ? `?${query}` : location.pathname);
}

async function act(name, action) {
  if (action === "unload" && !confirm(`Unload ${name}? Requests to it fail until it is loaded again.`)) return;
  const body = [...table.tBodies].find((b) => b.dataset.model === name);
  const message = body.querySelector(".action-msg");
  const badge = body.querySelector('[data-bind="model-state"]');
  busy.add(name);
  updateBody(body, lastRows.filter((r) => r.name === name));
  badge.textContent = action === "load" ? "LOADING…" : "UNLOADING…";
  badge.className = "badge state-loading";
  message.className = "action-msg";
  message.textContent = action === "load" ? `Loading ${name}…` : `Unloading ${name}…`;
  // Exactly what tritonclient.http sends for load_model / unload_model.
  const payload = action === "load" ? {} : { parameters: { unload_dependents: false } };
  let text;
  let failed = false;
  try {
    const response = await fetch(`/v2/repository/models/${encodeURIComponent(name)}/${action}`, {
      method: "POST",
      headers: withToken({ "Content-Type": "application/json" }),
      body: JSON.stringify(payload),
      signal: AbortSignal.timeout(300000),
    });
    failed = !response.ok;
    if (response.status === 401 && controls === "token") {
      forgetAccessToken();
      allowed = false;
      applyControls();
      announce("The server refused the token: enter it again.", true);
    }
    text = failed ? `${action} failed: ${await readError(response)}` : `${action === "load" ? "Loaded" : "Unloaded"} ${name}.`;
  } catch (error) {
    failed = true;
    text = `${action} failed: ${error.message}`;
  }
  busy.delete(name);
  await refresh();
  message.className = `action-msg${failed ? " error" : ""}`;
  message.textContent = text;
}
