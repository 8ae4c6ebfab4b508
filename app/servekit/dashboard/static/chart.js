// The dashboard's one chart: horizontal bars drawn as SVG (no library), each with its label
// before it and its value after it. Used by the try-it-out results (top values of an output)
// and the model page (batch sizes, why batches stopped, time in queue).
const SVG = "http://www.w3.org/2000/svg";

/**
 * An <svg class="chart"> with one bar per row ({label, value, text}; ``text`` defaults to the
 * value). Bars start at zero, so negative values extend left of it. Every bar carries its
 * label and value in data-label / data-value, and ``description`` is read out as the image.
 * Labels wider than half the chart (long labels on a phone) go above their bars instead.
 */
export function barChart(rows, { description, width = 560, labelWidth = 64 }) {
  const lo = Math.min(0, ...rows.map((r) => r.value));
  const hi = Math.max(0, ...rows.map((r) => r.value));
  const span = hi - lo || 1;
  const above = labelWidth > width / 2;
  const left = above ? 0 : labelWidth;
  const row = above ? 40 : 24;
  const barArea = width - left - 96;
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("viewBox", `0 0 ${width} ${rows.length * row + 8}`);
  svg.setAttribute("class", "chart");
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", description);
  const add = (tag, attrs, text) => {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
    if (text !== undefined) node.textContent = text;
    svg.append(node);
  };
  rows.forEach(({ label, value, text }, k) => {
    const y = k * row + 4 + (above ? 16 : 0);
    const x0 = left + ((Math.min(value, 0) - lo) / span) * barArea;
    const w = Math.max(1, (Math.abs(value) / span) * barArea);
    if (above) add("text", { x: 0, y: y - 4, class: "label" }, label);
    else add("text", { x: labelWidth - 8, y: y + 15, "text-anchor": "end", class: "label" }, label);
    add("rect", { x: x0, y, width: w, height: 18, rx: 3, class: value ? "bar" : "bar zero",
      "data-label": label, "data-value": value });
    add("text", { x: x0 + w + 6, y: y + 15 }, text ?? String(value));
  });
  return svg;
}
