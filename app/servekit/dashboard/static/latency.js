// The model page's latency chart: p50/p90/p99 (lines, ms) and requests per second (columns)
// per 10 s slot of the last minutes, from the server's rolling window (the dashboard JSON's
// stats.recent: app/servekit/dashboard/views.py). SVG, no library, like chart.js.
// x is time over the whole window ("-5 min" ... "now"); the latency scale spans the data's
// range with some headroom, the throughput scale starts at zero (columns are counts).
import { el } from "./common.js";

const SVG = "http://www.w3.org/2000/svg";
const LINES = [["p50_ms", "p50"], ["p90_ms", "p90"], ["p99_ms", "p99"]];

function node(tag, attrs, text) {
  const made = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) made.setAttribute(k, String(v));
  if (text !== undefined) made.textContent = text;
  return made;
}

/** A round step (1, 2 or 5 times a power of ten) near ``span / count``. */
function niceStep(span, count) {
  const raw = span / count;
  const power = 10 ** Math.floor(Math.log10(raw));
  const unit = raw / power;
  return (unit <= 1 ? 1 : unit <= 2 ? 2 : unit <= 5 ? 5 : 10) * power;
}

/** The smallest round number (1, 1.5, 2, 2.5, 3, 4, 5, 6 or 8 times a power of ten) >= ``value``. */
function niceCeil(value) {
  const power = 10 ** Math.floor(Math.log10(value));
  const unit = [1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10].find((m) => m * power >= value * (1 - 1e-9));
  return unit * power;
}

/** The latency scale: the data's range plus headroom, widened to round ticks, never below 0. */
function latencyScale(values) {
  const lo = Math.min(...values);
  const hi = Math.max(...values);
  const span = hi - lo || hi * 0.5 || 1; // one value: a band around it
  const step = niceStep(span * 1.3, 4);
  const from = Math.max(0, Math.floor((lo - span * 0.15) / step) * step);
  const to = Math.ceil((hi + span * 0.15) / step) * step;
  const ticks = [];
  for (let t = from; t <= to + step / 2; t += step) ticks.push(Number(t.toPrecision(12)));
  return { from, to: Math.max(to, from + step), ticks };
}

/** A tick's text: as many decimals as the step needs. */
function tickText(value, step) {
  const decimals = Math.max(0, Math.min(3, -Math.floor(Math.log10(step))));
  return value.toFixed(decimals);
}

/** An <svg class="chart latency"> of ``points`` (oldest first, one per slot of the window). */
export function latencyChart(points, width = 640) {
  const height = 262;
  const left = 52;
  const right = 14;
  const plot = width - left - right;
  const top = 22; // latency panel: top..mid
  const mid = 138;
  const rateTop = 170; // throughput panel: rateTop..low
  const low = 222;
  const slotMs = points.length > 1 ? points[1].start_ms - points[0].start_ms : 10_000;
  const start = points[0].start_ms;
  const end = points[points.length - 1].start_ms + slotMs; // "now": the current slot's end
  const x = (ms) => left + ((ms - start) / (end - start)) * plot;
  const values = points.flatMap((p) => LINES.map(([k]) => p[k])).filter((v) => v != null);
  const scale = latencyScale(values.length ? values : [0]);
  const y = (ms) => mid - ((mid - top) * (ms - scale.from)) / (scale.to - scale.from);
  const rateTo = niceCeil(Math.max(1, ...points.map((p) => p.per_second)));
  const busy = points.filter((p) => p.requests);
  const last = busy[busy.length - 1];
  const svg = node("svg", { viewBox: `0 0 ${width} ${height}`, class: "chart latency", role: "img",
    "aria-label": last
      ? `Latency over the last minutes, latest: p50 ${last.p50_ms} ms, p90 ${last.p90_ms} ms, ` +
        `p99 ${last.p99_ms} ms at ${last.per_second} requests/s`
      : "No request in the last minutes" });
  // Panels, their gridlines and scales.
  svg.append(node("rect", { x: left, y: top, width: plot, height: mid - top, class: "frame", "data-panel": "latency" }));
  svg.append(node("rect", { x: left, y: rateTop, width: plot, height: low - rateTop, class: "frame", "data-panel": "throughput" }));
  svg.append(node("text", { x: 0, y: 12, class: "label" }, "ms"));
  const step = scale.ticks.length > 1 ? scale.ticks[1] - scale.ticks[0] : 1;
  for (const t of scale.ticks) {
    svg.append(node("line", { x1: left, x2: left + plot, y1: y(t), y2: y(t), class: "grid" }));
    svg.append(node("text", { x: left - 6, y: y(t) + 4, "text-anchor": "end", class: "tick" }, tickText(t, step)));
  }
  svg.append(node("text", { x: 0, y: rateTop - 10, class: "label" }, "req/s"));
  for (const t of [0, rateTo]) {
    const ty = low - ((low - rateTop) * t) / rateTo;
    svg.append(node("line", { x1: left, x2: left + plot, y1: ty, y2: ty, class: "grid" }));
    svg.append(node("text", { x: left - 6, y: ty + 4, "text-anchor": "end", class: "tick" }, String(Number(t.toPrecision(6)))));
  }
  // The time axis: a gridline a minute from the window's start to now, labelled every minute
  // (every other one where a minute is narrower than its label, as on a phone).
  const span = Math.floor((end - start) / 60_000);
  const every = plot / Math.max(1, span) < 56 ? 2 : 1;
  for (let minutes = span; minutes >= 0; minutes -= 1) {
    const tx = x(end - minutes * 60_000);
    const anchor = tx <= left + 1 ? "start" : minutes === 0 ? "end" : "middle";
    svg.append(node("line", { x1: tx, x2: tx, y1: top, y2: low + 4, class: "grid time" }));
    if (minutes % every) continue;
    svg.append(node("text", { x: tx, y: low + 18, "text-anchor": anchor, class: "tick time" },
      minutes ? `-${minutes} min` : "now"));
  }
  // Requests per second: a column per slot, from zero.
  points.forEach((p) => {
    const h = ((low - rateTop) * p.per_second) / rateTo;
    const x0 = x(p.start_ms);
    svg.append(node("rect", { x: x0 + 1, y: low - h, width: Math.max(1, x(p.start_ms + slotMs) - x0 - 2),
      height: Math.max(h, 0), class: p.requests ? "bar" : "bar zero",
      "data-value": p.per_second, "data-p99": p.p99_ms ?? "" }));
  });
  // The percentiles: a line each, broken where a slot had no request, and a dot per slot
  // (one busy slot is a point, not an empty line).
  for (const [key, name] of LINES) {
    let d = "";
    let previous = false;
    const dots = [];
    for (const p of points) {
      if (p[key] == null) { previous = false; continue; }
      const px = x(p.start_ms + slotMs / 2).toFixed(1);
      const py = y(p[key]).toFixed(1);
      d += `${previous ? "L" : "M"}${px},${py} `;
      previous = true;
      dots.push([px, py]);
    }
    if (d) svg.append(node("path", { d: d.trim(), class: `line ${name}`, "data-line": name }));
    for (const [cx, cy] of dots) svg.append(node("circle", { cx, cy, r: 2.5, class: `dot ${name}` }));
  }
  LINES.forEach(([, name], k) => svg.append(node("text", { x: left + k * 56, y: height - 4, class: `key ${name}` }, name)));
  return svg;
}

/** Draw (again) the latency chart of one version over its server-rendered table. */
export function drawLatency(version) {
  const figure = document.querySelector(`figure[data-latency="${CSS.escape(version.version)}"]`);
  if (!figure || !version.stats?.recent) return;
  for (const old of figure.querySelectorAll("table, p.empty")) old.hidden = true;
  const holder = figure.querySelector(".chart-holder");
  const width = Math.max(280, Math.min(1200, holder.clientWidth || 560));
  holder.replaceChildren(version.stats.recent.some((p) => p.requests)
    ? latencyChart(version.stats.recent, width)
    : el("p", { class: "muted small", text: "No successful request in the last minutes." }));
}
