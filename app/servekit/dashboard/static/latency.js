// The model page's latency chart: p50/p90/p99 (lines, ms) and requests per second (columns)
// per 10 s slot of the last minutes, from the server's rolling window (the dashboard JSON's
// stats.recent: app/servekit/dashboard/views.py). SVG, no library, like chart.js.
import { el } from "./common.js";

const SVG = "http://www.w3.org/2000/svg";
const LINES = [["p50_ms", "p50"], ["p90_ms", "p90"], ["p99_ms", "p99"]];

function node(tag, attrs, text) {
  const made = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) made.setAttribute(k, String(v));
  if (text !== undefined) made.textContent = text;
  return made;
}

/** An <svg class="chart latency"> of ``points`` (oldest first). */
export function latencyChart(points, width = 640) {
  const height = 220;
  const left = 56;
  const plot = width - left - 8;
  const top = 20;
  const mid = 130; // latency panel: top..mid; throughput: mid+24..height-16
  const low = height - 16;
  const step = plot / points.length;
  const peakMs = Math.max(0.001, ...points.flatMap((p) => LINES.map(([k]) => p[k] ?? 0)));
  const peakRate = Math.max(1, ...points.map((p) => p.per_second));
  const busy = points.filter((p) => p.requests);
  const last = busy[busy.length - 1];
  const svg = node("svg", { viewBox: `0 0 ${width} ${height}`, class: "chart latency", role: "img",
    "aria-label": last
      ? `Latency over the last minutes, latest: p50 ${last.p50_ms} ms, p90 ${last.p90_ms} ms, ` +
        `p99 ${last.p99_ms} ms at ${last.per_second} requests/s`
      : "No request in the last minutes" });
  svg.append(node("text", { x: 0, y: 12, class: "label" }, `ms (max ${peakMs})`));
  svg.append(node("text", { x: 0, y: mid + 18, class: "label" }, `req/s (max ${peakRate})`));
  for (const [key, name] of LINES) {
    const coords = [];
    points.forEach((p, i) => {
      if (p[key] == null) return;
      coords.push(`${(left + (i + 0.5) * step).toFixed(1)},${(mid - ((mid - top) * p[key]) / peakMs).toFixed(1)}`);
    });
    if (coords.length) svg.append(node("polyline", { points: coords.join(" "), class: `line ${name}`, "data-line": name }));
    for (const xy of coords) { // a dot per slot: one busy slot is a point, not an empty line
      const [cx, cy] = xy.split(",");
      svg.append(node("circle", { cx, cy, r: 3, class: `dot ${name}` }));
    }
  }
  points.forEach((p, i) => {
    const h = ((low - mid - 24) * p.per_second) / peakRate;
    svg.append(node("rect", { x: left + i * step + 1, y: low - h, width: Math.max(1, step - 2), height: Math.max(h, 0),
      class: p.requests ? "bar" : "bar zero", "data-value": p.per_second, "data-p99": p.p99_ms ?? "" }));
  });
  LINES.forEach(([, name], k) => svg.append(node("text", { x: left + k * 56, y: height - 2, class: `key ${name}` }, name)));
  return svg;
}

/** Draw (again) the latency chart of one version over its server-rendered table. */
export function drawLatency(version) {
  const figure = document.querySelector(`figure[data-latency="${CSS.escape(version.version)}"]`);
  if (!figure || !version.stats?.recent) return;
  for (const old of figure.querySelectorAll("table, p.empty")) old.hidden = true;
  const holder = figure.querySelector(".chart-holder");
  const width = Math.max(280, Math.min(640, holder.clientWidth || 560));
  holder.replaceChildren(version.stats.recent.some((p) => p.requests)
    ? latencyChart(version.stats.recent, width)
    : el("p", { class: "muted small", text: "No successful request in the last minutes." }));
}
