// Model page: statistics, version states and the queue and batching charts refresh in place
// every two seconds.
import { barChart } from "./chart.js";
import { accessToken, el, getJSON, ms, poll, readError, timestampMs, withToken } from "./common.js";
import { drawLatency } from "./latency.js"; // the latency/throughput chart (its own file)

// What each chart of the "Queue and batching" section draws from a version's statistics
// (the dashboard JSON: app/servekit/dashboard/views.py version_stats).
const CHARTS = {
  "batch-sizes": {
    rows: (stats) => stats.batches.map((b) => ({ label: String(b.size), value: b.count })),
    labelWidth: 64,
    what: (rows) => `Model calls by batch size: ${rows.map((r) => `${r.label} rows ${r.value}`).join(", ")}`,
    empty: "No model call yet.",
  },
  dispatch: {
    rows: (stats) => stats.dispatch.map((d) => ({ label: d.label, value: d.count })),
    labelWidth: 280,
    what: (rows) => `Batches by why they stopped: ${rows.map((r) => `${r.label} ${r.value}`).join(", ")}`,
    empty: "No batch yet.",
  },
  queue: {
    rows: (stats) => stats.queue_histogram.map((q) => ({ label: q.label, value: q.count })),
    labelWidth: 96,
    what: (rows) => `Successful requests by time in the queue: ${rows.map((r) => `${r.label} ${r.value}`).join(", ")}`,
    empty: "No successful request yet.",
  },
};

/** Draw (again) the charts of one version; each replaces its server-rendered table. */
function drawCharts(version) {
  const group = document.querySelector(`[data-charts="${CSS.escape(version.version)}"]`);
  if (!group || !version.stats) return;
  for (const figure of group.querySelectorAll("figure[data-chart]")) {
    const chart = CHARTS[figure.dataset.chart];
    if (!chart) continue;
    const rows = chart.rows(version.stats);
    for (const old of figure.querySelectorAll("table, p.empty")) old.hidden = true;
    const holder = figure.querySelector(".chart-holder");
    holder.replaceChildren(rows.length
      ? barChart(rows, {
        labelWidth: chart.labelWidth,
        width: Math.max(280, Math.min(chart.labelWidth + 360, holder.clientWidth || 560)),
        description: chart.what(rows),
      })
      : el("p", { class: "muted small", text: chart.empty }));
  }
}

function pick(object, path) {
  return path.split(".").reduce((value, key) => (value == null ? undefined : value[key]), object);
}

export function initModelPage() {
  const head = document.querySelector(".page-head[data-model]");
  const table = document.getElementById("version-stats");
  if (!head || !table) return;
  const url = `/dashboard/api/models/${encodeURIComponent(head.dataset.model)}`;
  let shown = null; // the last answer: the charts are drawn again from it when the width changes
  window.addEventListener("resize", () => shown?.versions.forEach((v) => { drawCharts(v); drawLatency(v); }));
  const refresh = async () => {
    const model = await getJSON(url);
    if (!model) return;
    shown = model;
    const badge = head.querySelector('[data-bind="model-state"]');
    badge.textContent = model.state;
    badge.className = `badge state-${model.state.toLowerCase()}${model.failed ? " failed" : ""}`;
    for (const version of model.versions) {
      const row = table.querySelector(`tr[data-version="${CSS.escape(version.version)}"]`);
      if (!row) continue;
      const state = row.querySelector('[data-col="state"]');
      state.textContent = version.state;
      state.className = `badge state-${version.state.toLowerCase()}${version.failed ? " failed" : ""}`;
      for (const cell of row.querySelectorAll("[data-stat]")) {
        const key = cell.dataset.stat;
        const value = version.stats ? pick(version.stats, key) : undefined;
        if (key.startsWith("avg_ms.")) cell.textContent = ms(value);
        else if (cell.dataset.kind === "time") cell.textContent = timestampMs(value);
        else cell.textContent = String(value ?? 0);
      }
      drawCharts(version);
      drawLatency(version);
    }
  };
  refresh(); // the charts at once, then live
  poll(refresh, 2000);
}

// The Benchmark button: the server drives this model over its own HTTP and gRPC listeners
// (POST /dashboard/api/models/NAME/benchmark) and answers a table. It needs the admin group's
// token: the kept access token when it opens admin, else (distinct tokens per group) the admin
// token typed into the benchmark's own field, kept apart in this tab's sessionStorage. Leaving
// the page aborts the request, and the server stops the benchmark when its client leaves.
const ADMIN_TOKEN_KEY = "servekit.adminToken";
let typedAdminToken = ""; // when sessionStorage refuses to keep it

function adminToken() {
  try {
    return sessionStorage.getItem(ADMIN_TOKEN_KEY) || typedAdminToken || accessToken();
  } catch {
    return typedAdminToken || accessToken();
  }
}

export function initBenchmark() {
  const button = document.getElementById("benchmark-run");
  const head = document.querySelector(".page-head[data-model]");
  const section = document.getElementById("benchmark");
  if (!button || !head || !section) return;
  const status = document.getElementById("benchmark-status");
  const table = document.getElementById("benchmark-table");
  const tokenForm = document.getElementById("benchmark-token");
  const url = `/dashboard/api/models/${encodeURIComponent(head.dataset.model)}/benchmark`;
  const run = async () => {
    section.hidden = false;
    button.disabled = true;
    if (tokenForm) tokenForm.hidden = true;
    status.textContent = "Running: HTTP and gRPC, 1 and 8 requests in flight, 2 s each…";
    try {
      const response = await fetch(url, {
        method: "POST",
        headers: withToken({ "Content-Type": "application/json" }, adminToken()),
        body: JSON.stringify({ seconds: 2, concurrency: [1, 8] }),
        signal: AbortSignal.timeout(120000),
      });
      if (response.status === 401 && tokenForm) {
        status.textContent = `The benchmark needs the admin token: ${await readError(response)}`;
        tokenForm.hidden = false;
        tokenForm.querySelector("input").focus();
        return;
      }
      if (!response.ok) {
        status.textContent = `Benchmark failed: ${await readError(response)}`;
        return;
      }
      const result = await response.json();
      const peak = Math.max(1, ...result.rows.map((row) => row.rps));
      const body = table.querySelector("tbody");
      body.replaceChildren(...result.rows.map((row) => el("tr", {},
        el("td", { "data-label": "Protocol", text: row.protocol }),
        el("td", { class: "num", "data-label": "In flight", text: row.concurrency }),
        el("td", { class: "num", "data-label": "Requests/s", text: row.rps.toFixed(1) }),
        el("td", { "data-label": "Throughput" },
          el("meter", { min: 0, max: peak, value: row.rps, title: `${row.rps} requests/s` })),
        el("td", { class: "num", "data-label": "p50 ms", text: ms(row.p50_ms) }),
        el("td", { class: "num", "data-label": "p90 ms", text: ms(row.p90_ms) }),
        el("td", { class: "num", "data-label": "p99 ms", text: ms(row.p99_ms) }),
        el("td", { class: "num", "data-label": "Errors", text: row.errors }),
      )));
      table.hidden = false;
      status.textContent = "Done. Numbers include the server driving itself: compare, do not quote.";
    } catch (error) {
      status.textContent = `Benchmark failed: ${error}`;
    } finally {
      button.disabled = false;
    }
  };
  button.addEventListener("click", run);
  tokenForm?.addEventListener("submit", (event) => {
    event.preventDefault();
    const input = tokenForm.querySelector("input");
    const token = input.value.trim();
    if (!token) return;
    input.value = "";
    typedAdminToken = token;
    try {
      sessionStorage.setItem(ADMIN_TOKEN_KEY, token);
    } catch {
      /* storage refused: nothing to keep it in, the run below fails again with 401 */
    }
    run();
  });
}
