// Try-it-out results: each output as a table with its shape and datatype, a bar chart of the
// top values of a 1-D score vector, the round-trip latency, the raw JSON, and the equivalent
// curl, servekit.connect and tritonclient snippets for the exact request that was sent.
import { barChart } from "./chart.js";
import { copyText, el } from "./common.js";
import { imageLayout } from "./tensors.js";

const MAX_CELLS = 256;
const MAX_COLUMNS = 16;
const NUMPY = {
  BOOL: "np.bool_", UINT8: "np.uint8", UINT16: "np.uint16", UINT32: "np.uint32", UINT64: "np.uint64",
  INT8: "np.int8", INT16: "np.int16", INT32: "np.int32", INT64: "np.int64", FP16: "np.float16",
  FP32: "np.float32", FP64: "np.float64", BF16: "np.float32", BYTES: "np.object_",
};

const $ = (id) => document.getElementById(id);

function reveal() {
  $("try-result").hidden = false;
}

function summary(parts) {
  $("try-summary").replaceChildren(...parts);
}

export function showError(message, elapsedMs, raw = "") {
  reveal();
  $("try-error").textContent = message;
  $("try-error").hidden = false;
  $("try-outputs-view").replaceChildren();
  $("try-raw").textContent = raw;
  summary(elapsedMs === undefined ? [] : [el("span", { class: "latency", text: `${elapsedMs.toFixed(1)} ms round trip` })]);
}

/** How a value is shown: floats to 6 significant digits (the exact value is in data-value). */
function show(value) {
  if (typeof value === "number" && !Number.isInteger(value)) return String(Number(value.toPrecision(6)));
  return typeof value === "string" ? value : String(value);
}

function cell(value) {
  const numeric = typeof value === "number";
  return el("td", { class: numeric ? "num" : null, dataset: { value: String(value) }, text: show(value) });
}

function valuesTable(output) {
  const data = output.data;
  const dims = output.shape;
  const last = dims.length ? dims[dims.length - 1] : 1;
  const shown = data.slice(0, MAX_CELLS);
  let table;
  if (dims.length >= 2 && last > 0 && last <= MAX_COLUMNS) {
    const head = el("tr", {}, el("th", { class: "idx", scope: "col", text: "row" }),
      Array.from({ length: last }, (_, j) => el("th", { class: "num idx", scope: "col", text: String(j) })));
    const rows = [];
    for (let start = 0; start < shown.length; start += last) {
      rows.push(el("tr", {}, el("th", { class: "idx", scope: "row", text: String(start / last) }),
        shown.slice(start, start + last).map(cell)));
    }
    table = el("table", { class: "data values" }, el("thead", {}, head), el("tbody", {}, rows));
  } else {
    const rows = shown.map((value, i) => el("tr", {}, el("th", { class: "idx", scope: "row", text: String(i) }), cell(value)));
    table = el("table", { class: "data values" },
      el("thead", {}, el("tr", {}, el("th", { class: "idx", scope: "col", text: "index" }), el("th", { scope: "col", text: "value" }))),
      el("tbody", {}, rows));
  }
  const note = data.length > MAX_CELLS
    ? el("p", { class: "truncated", text: `Showing the first ${MAX_CELLS} of ${data.length} values; all are in the raw JSON.` })
    : null;
  const wrapped = el("div", { class: "table-wrap" }, table, note);
  if (data.length <= 64) return wrapped;
  // Long outputs (images, embeddings) fold away so the page stays readable.
  return el("details", { class: "values-fold" }, el("summary", { text: `Values (${data.length})` }), wrapped);
}

const FLOATS = new Set(["FP16", "FP32", "FP64", "BF16"]);

/** Whether an output reads as scores of one example (class probabilities, logits): floats
 * whose only dimension above 1 is the last, [1, ..., C]; or [C] when the model declares that
 * dimension fixed. Labels (integers, strings) and one value per row of a batch ([N], declared
 * [-1]) are not ranked as scores (issue 27: a 2-row batch's `label` output was). */
export function scoreLike(output, declared) {
  const dims = output.shape;
  if (!FLOATS.has(output.datatype) || output.data.length < 2 || dims.length === 0) return false;
  if (!output.data.every((v) => typeof v === "number")) return false;
  const last = dims[dims.length - 1];
  if (last < 2 || !dims.slice(0, -1).every((d) => d === 1)) return false;
  if (dims.length > 1) return true;
  const spec = declared?.shape;
  return Array.isArray(spec) && spec.length === 1 && spec[0] >= 0;
}

/** A bar chart of the top values of a score-like output (see ``scoreLike``). */
function chart(output, declared) {
  if (!scoreLike(output, declared)) return null;
  const top = output.data.map((v, i) => [v, i]).sort((a, b) => b[0] - a[0]).slice(0, 10);
  const available = $("try-outputs-view").clientWidth - 40;
  const svg = barChart(top.map(([value, index]) => ({ label: `#${index}`, value, text: show(value) })), {
    width: Math.max(280, Math.min(640, available || 560)),
    description: `Top ${top.length} values of ${output.name}: ` +
      top.map(([v, i]) => `index ${i} = ${show(v)}`).join(", "),
  });
  return el("figure", { class: "card chart-card" },
    el("figcaption", { class: "small muted", text: `Top ${top.length} of ${output.data.length} values` }), svg);
}

/** A picture of an image-shaped UINT8 output (HWC or CHW, one image). */
function preview(output) {
  const layout = imageLayout(output.datatype, output.shape);
  if (!layout || !output.data.length) return null;
  const { h, w, c, order } = layout;
  const canvas = el("canvas", { class: "preview", width: w, height: h, role: "img",
    "aria-label": `${output.name} as a ${w}×${h} image` });
  const context = canvas.getContext("2d");
  const pixels = context.createImageData(w, h);
  for (let y = 0; y < h; y++) {
    for (let x = 0; x < w; x++) {
      const at = (k) => output.data[order === "HWC" ? (y * w + x) * c + k : k * h * w + y * w + x];
      const p = (y * w + x) * 4;
      const [r, g, b] = c >= 3 ? [at(0), at(1), at(2)] : [at(0), at(0), at(0)];
      pixels.data.set([r, g, b, c === 4 ? at(3) : 255], p);
    }
  }
  context.putImageData(pixels, 0, 0);
  return canvas;
}

export function showResult(result, elapsedMs, status, declared = []) {
  reveal();
  $("try-error").hidden = true;
  summary([
    el("span", { class: "pill ok", text: `HTTP ${status}` }),
    el("span", { class: "latency", dataset: { latencyMs: elapsedMs.toFixed(3) }, text: `${elapsedMs.toFixed(1)} ms round trip` }),
    el("span", { class: "muted", text: `model ${result.model_name}, version ${result.model_version}` }),
  ]);
  const blocks = (result.outputs || []).map((output) =>
    el("section", { class: "output-block", dataset: { output: output.name } },
      el("h3", {}, el("code", { text: output.name }), el("span", { class: "badge state-unavailable", text: output.datatype }),
        el("span", { class: "muted small", text: `shape [${output.shape.join(", ")}]` })),
      preview(output), chart(output, declared.find((d) => d.name === output.name)),
      valuesTable(output)));
  $("try-outputs-view").replaceChildren(...blocks);
  $("try-raw").textContent = JSON.stringify(result, null, 2);
}

const shellQuote = (text) => `'${text.replaceAll("'", "'\\''")}'`;

function python(name, version, request, token) {
  const host = location.host;
  const lines = [...(token ? ["import os"] : []), "import numpy as np", "import tritonclient.http as httpclient", "",
    `client = httpclient.InferenceServerClient(url=${JSON.stringify(host)})`, "inputs = []"];
  for (const input of request.inputs) {
    const literal = JSON.stringify(input.data).replaceAll("true", "True").replaceAll("false", "False");
    const values = input.datatype === "BOOL" ? literal : JSON.stringify(input.data);
    lines.push(`tensor = httpclient.InferInput(${JSON.stringify(input.name)}, ${JSON.stringify(input.shape)}, ${JSON.stringify(input.datatype)})`);
    lines.push(`tensor.set_data_from_numpy(np.array(${values}, dtype=${NUMPY[input.datatype]}).reshape(${JSON.stringify(input.shape)}))`);
    lines.push("inputs.append(tensor)");
  }
  const outputs = request.outputs
    ? `[${request.outputs.map((o) => `httpclient.InferRequestedOutput(${JSON.stringify(o.name)})`).join(", ")}]`
    : "None";
  const versionArg = version ? `, model_version=${JSON.stringify(version)}` : "";
  // The token is never written out: the snippet reads it from the environment.
  const headersArg = token ? ', headers={"Authorization": "Bearer " + os.environ["SERVEKIT_TOKEN"]}' : "";
  lines.push(`result = client.infer(${JSON.stringify(name)}, inputs${versionArg}, outputs=${outputs}${headersArg})`);
  lines.push("for output in result.get_response()[\"outputs\"]:");
  lines.push("    print(output[\"name\"], result.as_numpy(output[\"name\"]))");
  return lines.join("\n");
}

/** The request with servekit's own client: ``servekit.connect`` reads $SERVEKIT_TOKEN itself. */
function connect(name, version, request) {
  const lines = ["import numpy as np", "import servekit", "",
    `server = servekit.connect(${JSON.stringify(location.origin)})`, "inputs = {"];
  for (const input of request.inputs) {
    const literal = JSON.stringify(input.data).replaceAll("true", "True").replaceAll("false", "False");
    const values = input.datatype === "BOOL" ? literal : JSON.stringify(input.data);
    lines.push(`    ${JSON.stringify(input.name)}: np.array(${values}, dtype=${NUMPY[input.datatype]}).reshape(${JSON.stringify(input.shape)}),`);
  }
  lines.push("}");
  const versionArg = version ? `, version=${JSON.stringify(version)}` : "";
  const outputsArg = request.outputs ? `, outputs=${JSON.stringify(request.outputs.map((o) => o.name))}` : "";
  lines.push(`outputs = server.infer(${JSON.stringify(name)}, inputs${versionArg}${outputsArg})`);
  lines.push("for name, value in outputs.items():");
  lines.push("    print(name, value)");
  return lines.join("\n");
}

/** The request as curl, servekit.connect and tritonclient; with ``token`` they read it from
 * $SERVEKIT_TOKEN. */
export function showSnippets(name, version, path, request, body, token = false) {
  reveal();
  $("try-curl").textContent = [
    `curl -s -X POST ${shellQuote(location.origin + path)} \\`,
    "  -H 'Content-Type: application/json' \\",
    ...(token ? ['  -H "Authorization: Bearer $SERVEKIT_TOKEN" \\'] : []),
    `  -d ${shellQuote(body)}`,
  ].join("\n");
  $("try-connect").textContent = connect(name, version, request);
  $("try-python").textContent = python(name, version, request, token);
}

document.addEventListener("click", async (event) => {
  const button = event.target.closest("button[data-copy]");
  if (!button) return;
  await copyText($(button.dataset.copy).textContent);
  button.dataset.label ??= button.textContent;
  button.textContent = "Copied";
  setTimeout(() => (button.textContent = button.dataset.label), 1500);
});
