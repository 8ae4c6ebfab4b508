// Model page: statistics and version states refresh in place every two seconds.
import { getJSON, ms, poll, timestampMs } from "./common.js";

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
