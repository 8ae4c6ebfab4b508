// A pipeline's model page (templates/model.html, #pipeline-steps): its steps as the server
// drew them, refreshed every two seconds from the dashboard JSON (each step's model version,
// state and averages, app/servekit/dashboard/views.py pipeline_steps), with a meter per step
// showing its share of the steps' summed request time. Without JavaScript the page shows the
// same steps and figures, as of its rendering.
import { el, getJSON, ms, poll } from "./common.js";

function pick(object, path) {
  return path.split(".").reduce((value, key) => (value == null ? undefined : value[key]), object);
}

function draw(list, steps) {
  const total = steps.reduce((sum, step) => sum + (step.stats?.avg_ms.request ?? 0), 0);
  for (const step of steps) {
    const item = list.querySelector(`li[data-step="${CSS.escape(String(step.step))}"]`);
    if (!item) continue;
    const badge = item.querySelector('[data-col="state"]');
    if (badge) {
      badge.textContent = step.state;
      badge.className = `badge state-${step.state.toLowerCase()}`;
    }
    if (!step.stats) continue;
    for (const cell of item.querySelectorAll("[data-step-stat]")) {
      const key = cell.dataset.stepStat;
      const value = pick(step.stats, key);
      cell.textContent = key.startsWith("avg_ms.") ? ms(value) : String(value ?? 0);
    }
    const share = step.stats.avg_ms.request ?? 0;
    item.querySelector(".step-bar")?.replaceChildren(el("meter", {
      min: 0, max: total || 1, value: share,
      title: `${ms(share)} ms of the steps' ${ms(total)} ms`,
    }));
  }
}

export function initPipeline() {
  const list = document.getElementById("pipeline-steps");
  const head = document.querySelector(".page-head[data-model]");
  if (!list || !head) return;
  const url = `/dashboard/api/models/${encodeURIComponent(head.dataset.model)}`;
  const refresh = async () => {
    const model = await getJSON(url);
    if (model?.pipeline?.length) draw(list, model.pipeline);
  };
  refresh();
  poll(refresh, 2000);
}
