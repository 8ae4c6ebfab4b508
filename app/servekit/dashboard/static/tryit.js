// Try-it-out: a form generated from the model's V2 metadata, one field per input, submitted
// through the public inference API (POST /v2/models/{m}[/versions/{v}]/infer) as JSON.
import { isProtected } from "./access.js";
import { el, readError, withToken } from "./common.js";
import {
  checkNesting, checkShape, concreteShape, count, example, format, imageLayout, imageTensor, parseShape, parseValues,
  random, zeros,
} from "./tensors.js";
import { readTable, tableInputs } from "./tryit-table.js";
import { showError, showResult, showSnippets } from "./tryit-view.js";

const FILLS = { example, random, zeros };
let model;
let form;

function metadataFor(version) {
  return model.metadata[version || String(model.serving_version)] || Object.values(model.metadata)[0];
}

function inputField(spec, index) {
  const id = `input-${index}`;
  const shape = concreteShape(spec.shape);
  const editor = el("textarea", {
    id, name: spec.name, spellcheck: "false", autocomplete: "off",
    rows: Math.min(10, Math.max(3, shape.length > 1 ? shape[shape.length - 2] + 1 : 3)),
    "aria-describedby": `${id}-hint ${id}-error`,
  });
  const shapeInput = el("input", {
    id: `${id}-shape`, name: `${spec.name}.shape`, value: shape.join(", "), autocomplete: "off",
    readonly: spec.shape.every((d) => d >= 0) || null, "aria-describedby": `${id}-hint`,
  });
  const error = el("p", { class: "field-error", id: `${id}-error`, role: "alert", hidden: true });
  const fill = (kind) => {
    let dims;
    try {
      dims = parseShape(shapeInput.value);
    } catch (problem) {
      error.textContent = problem.message;
      error.hidden = false;
      return;
    }
    error.hidden = true;
    editor.value = format(FILLS[kind](spec.datatype, count(dims)), dims, spec.datatype);
  };
  const buttons = Object.keys(FILLS).map((kind) =>
    el("button", { type: "button", class: "btn small", dataset: { fill: kind },
      "aria-label": `Fill ${spec.name} with ${kind === "example" ? "an example" : kind}`,
      onclick: () => fill(kind), text: kind[0].toUpperCase() + kind.slice(1) }));
  const layout = imageLayout(spec.datatype, spec.shape);
  const upload = layout && el("label", { class: "btn small file-btn" }, "Image…",
    el("input", { type: "file", accept: "image/*", "aria-label": `Load an image into ${spec.name}`,
      onchange: async (event) => {
        const file = event.target.files[0];
        if (!file) return;
        try {
          const tensor = await imageTensor(file, layout, spec.shape.length);
          shapeInput.value = tensor.shape.join(", ");
          editor.value = format(tensor.values, tensor.shape, spec.datatype);
          error.hidden = true;
        } catch (problem) {
          error.textContent = `cannot read ${file.name} as an image: ${problem.message}`;
          error.hidden = false;
        }
      } }));
  const hint = spec.datatype === "BYTES"
    ? "One string per line, or a JSON array of strings."
    : "Nested JSON (nested as Shape says), or numbers separated by commas, spaces or new lines (shaped by Shape).";
  const dynamic = spec.shape.some((d) => d < 0) ? " Dimensions shown as -1 are free: set them in Shape." : "";
  fill("example");
  return el("fieldset", { class: "tensor-field", dataset: { input: spec.name } },
    el("legend", {}, spec.name, el("span", { class: "spec", text: `${spec.datatype} [${spec.shape.join(", ")}]` })),
    el("div", { class: "field-row" },
      el("label", { for: `${id}-shape` }, "Shape", shapeInput), ...buttons, upload),
    el("label", { for: id, class: "visually-hidden", text: `Values of ${spec.name}` }),
    editor,
    el("p", { class: "field-hint", id: `${id}-hint`, text: hint + dynamic }),
    error);
}

function build(version) {
  const meta = metadataFor(version);
  const table = tableInputs(model, meta); // a tabular model: one table (tryit-table.js)
  document.getElementById("try-inputs").replaceChildren(...(table ? [table] : meta.inputs.map(inputField)));
  document.getElementById("try-outputs").replaceChildren(...meta.outputs.map((spec) =>
    el("label", {}, el("input", { type: "checkbox", name: "output", value: spec.name, checked: true }),
      spec.name)));
}

/** Read the form into a V2 JSON request; field errors are shown next to their field. */
function collect() {
  const meta = metadataFor(form.version.value);
  const table = readTable(form, model, meta); // null unless the form shows a table
  let ok = true;
  const inputs = table ? table.inputs : meta.inputs.map((spec) => {
    const field = form.querySelector(`[data-input="${CSS.escape(spec.name)}"]`);
    const error = field.querySelector(".field-error");
    const editor = field.querySelector("textarea");
    const shapeInput = field.querySelector("input[name$='.shape']");
    try {
      const dims = parseShape(shapeInput.value);
      const parsed = parseValues(editor.value, spec.datatype, dims, spec.shape.length);
      const { values, shape } = parsed;
      checkShape(shape, spec.shape, values.length);
      if (parsed.disagrees) checkNesting(shape, dims);
      error.hidden = true;
      editor.removeAttribute("aria-invalid");
      return { name: spec.name, shape, datatype: spec.datatype, data: values };
    } catch (problem) {
      ok = false;
      error.textContent = `${spec.name}: ${problem.message}`;
      error.hidden = false;
      editor.setAttribute("aria-invalid", "true");
      return null;
    }
  });
  const chosen = [...form.querySelectorAll("input[name=output]:checked")].map((c) => c.value);
  if (!chosen.length) throw new Error("choose at least one output");
  if (!ok) throw new Error("fix the highlighted input");
  const request = table ? { ...table } : { inputs };
  // A tabular model answers a request naming no output with `predict` alone (as MLServer's
  // runtimes do): name the ticked outputs for it, so predict_proba comes when ticked.
  if (chosen.length < meta.outputs.length || model.tabular) request.outputs = chosen.map((name) => ({ name }));
  return request;
}

async function submit(event) {
  event.preventDefault();
  const button = document.getElementById("try-submit");
  const version = form.version.value;
  let request;
  try {
    request = collect();
  } catch (problem) {
    showError(`Not sent: ${problem.message}.`);
    return;
  }
  const name = encodeURIComponent(model.name);
  const path = version ? `/v2/models/${name}/versions/${encodeURIComponent(version)}/infer` : `/v2/models/${name}/infer`;
  const body = JSON.stringify(request);
  showSnippets(model.name, version, path, request, body, isProtected("inference"));
  button.disabled = true;
  button.setAttribute("aria-busy", "true");
  const started = performance.now();
  try {
    const response = await fetch(path, {
      method: "POST", headers: withToken({ "Content-Type": "application/json" }), body,
      signal: AbortSignal.timeout(120000),
    });
    if (!response.ok) {
      const raw = await response.clone().text();
      const message = await readError(response);
      showError(`HTTP ${response.status}: ${message}`, performance.now() - started, raw);
      return;
    }
    const result = await response.json();
    showResult(result, performance.now() - started, response.status, metadataFor(version).outputs);
  } catch (problem) {
    showError(`Request failed: ${problem.message}`, performance.now() - started);
  } finally {
    button.disabled = false;
    button.removeAttribute("aria-busy");
  }
}

function signatureOf(version) {
  const meta = metadataFor(version);
  return JSON.stringify([meta.inputs, meta.outputs]);
}

export function initTry() {
  const data = document.getElementById("model-data");
  form = document.getElementById("try-form");
  if (!data || !form) return;
  model = JSON.parse(data.textContent);
  build("");
  let shown = signatureOf("");
  form.version.addEventListener("change", () => {
    // Keep what the user typed when the other version takes the same inputs and outputs.
    if (signatureOf(form.version.value) !== shown) build(form.version.value);
    shown = signatureOf(form.version.value);
  });
  form.addEventListener("submit", submit);
  form.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) form.requestSubmit();
  });
  form.hidden = false;
}

