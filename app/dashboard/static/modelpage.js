// Model page: statistics and version states refresh in place every two seconds.
import { el, getJSON, ms, poll, readError, timestampMs, withToken } from "./common.js";

function pick(object, path) {
  return path.split(".").reduce((value, key) => (value == null ? undefined : value[key]), object);
}

export function initModelPage() {
  const head = document.querySelector(".page-head[data-model]");
  const table = document.getElementById("version-stats");
  if (!head || !table) return;
  const url = `/dashboard/api/models/${encodeURIComponent(head.dataset.model)}`;
  poll(async () => {
    const model = await getJSON(url);
    if (!model) return;
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
    }
  }, 2000);
}

// The Benchmark button: the server drives this model over its own HTTP and gRPC listeners
// (POST /dashboard/api/models/NAME/benchmark, admin group) and answers a table.
export function initBenchmark() {
  const button = document.getElementById("benchmark-run");
  const head = document.querySelector(".page-head[data-model]");
  const section = document.getElementById("benchmark");
  if (!button || !head || !section) return;
  const status = document.getElementById("benchmark-status");
  const table = document.getElementById("benchmark-table");
  const url = `/dashboard/api/models/${encodeURIComponent(head.dataset.model)}/benchmark`;
  button.addEventListener("click", async () => {
    section.hidden = false;
    button.disabled = true;
    status.textContent = "Running: HTTP and gRPC, 1 and 8 requests in flight, 2 s each…";
    try {
      const response = await fetch(url, {
        method: "POST",
        headers: withToken({ "Content-Type": "application/json" }),
        body: JSON.stringify({ seconds: 2, concurrency: [1, 8] }),
        signal: AbortSignal.timeout(120000),
      });
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
  });
}
