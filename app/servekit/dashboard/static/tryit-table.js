// Try-it-out for a tabular model (sklearn, xgboost, lightgbm, mlflow): a small table with one
// column per input (a model fitted on a DataFrame) or per feature (a model taking one [-1, F]
// matrix), one row per example row. Sent as MLServer's clients send a DataFrame: request
// parameters.content_type "pd", one [N, 1] tensor per column; a matrix model gets its one
// [N, F] tensor. tryit.js asks tableInputs() for the form and readTable() for the request.
// A text column (BYTES) is a text cell; when the metadata lists the values the fitted model
// knows (parameters.categories, e.g. a OneHotEncoder's categories) they are offered as
// choices and the example rows use them.
import { el } from "./common.js";
import { example } from "./tensors.js";

const NUMBER = /^(FP|INT|UINT)/;

/** The table's columns, or null when the model is not tabular or its inputs are no table. */
function columnsOf(model, meta) {
  if (!model.tabular) return null;
  const columnShaped = (spec) => spec.shape.length <= 2 && spec.shape.slice(1).every((d) => d === 1);
  if (meta.inputs.every(columnShaped)) {
    return {
      matrix: null,
      columns: meta.inputs.map((spec) => ({
        name: spec.name, datatype: spec.datatype, categories: knownValues(spec),
      })),
    };
  }
  const [only] = meta.inputs;
  const width = only && only.shape.length === 2 ? only.shape[1] : -1;
  if (meta.inputs.length !== 1 || width < 1 || width > 64) return null;
  const columns = Array.from({ length: width }, (_, i) => ({ name: `${only.name}[${i}]`, datatype: only.datatype }));
  return { matrix: only, columns };
}

/** The values the model lists for an input (metadata parameters.categories), or null. */
function knownValues(spec) {
  const known = spec.parameters && spec.parameters.categories;
  return Array.isArray(known) && known.length > 0 ? known.map(String) : null;
}

const choicesId = (index) => `tabular-choices-${index}`;

function cell(column, index, row, value) {
  return el("td", {}, el("input", {
    name: `${column.name}.${row}`, value: String(value), autocomplete: "off", spellcheck: "false",
    inputmode: NUMBER.test(column.datatype) ? "decimal" : null,
    list: column.categories ? choicesId(index) : null,
    "aria-label": `${column.name}, row ${row + 1}`,
  }));
}

function exampleValue(column, row, i) {
  if (column.categories) return column.categories[row % column.categories.length];
  return example(column.datatype, row + i + 1)[row + i];
}

function addRow(body, columns) {
  const row = body.rows.length;
  const values = columns.map((column, i) => exampleValue(column, row, i));
  body.append(el("tr", {}, ...columns.map((column, i) => cell(column, i, row, values[i]))));
}

/** The table field replacing the per-input fields, or null when the model is not tabular. */
export function tableInputs(model, meta) {
  const layout = columnsOf(model, meta);
  if (!layout) return null;
  const { columns } = layout;
  const body = el("tbody", {});
  for (let i = 0; i < 3; i += 1) addRow(body, columns);
  const error = el("p", { class: "field-error", id: "tabular-error", role: "alert", hidden: true });
  const table = el("table", { class: "data tabular-input", "aria-describedby": "tabular-hint tabular-error" },
    el("thead", {}, el("tr", {}, ...columns.map((column) =>
      el("th", { scope: "col" }, column.name, el("span", { class: "spec", text: ` ${column.datatype}` }))))),
    body);
  const remove = el("button", { type: "button", class: "btn small", text: "Remove row",
    onclick: () => { if (body.rows.length > 1) body.lastElementChild.remove(); } });
  const choices = columns.map((column, i) => (column.categories
    ? el("datalist", { id: choicesId(i) }, ...column.categories.map((value) => el("option", { value })))
    : null));
  return el("fieldset", { class: "tensor-field", dataset: { table: "true" } },
    el("legend", {}, layout.matrix ? `${layout.matrix.name} (one column per feature)` : "Rows (one column per input)"),
    el("div", { class: "tabular-scroll" }, table),
    el("div", { class: "field-row" },
      el("button", { type: "button", class: "btn small", text: "Add row", onclick: () => addRow(body, columns) }),
      remove),
    el("p", { class: "field-hint", id: "tabular-hint",
      text: "One row per example. Sent as a DataFrame is by MLServer's clients (content_type pd)." }),
    ...choices,
    error);
}

function parse(text, datatype, where) {
  const value = text.trim();
  if (datatype === "BYTES") return value;
  if (datatype === "BOOL") {
    if (!/^(true|false|1|0)$/i.test(value)) throw new Error(`${where}: not true or false`);
    return /^(true|1)$/i.test(value);
  }
  const number = Number(value);
  if (value === "" || Number.isNaN(number)) throw new Error(`${where}: "${value}" is not a number`);
  if (!datatype.startsWith("FP") && !Number.isInteger(number)) throw new Error(`${where}: not an integer`);
  return number;
}

/** The request's inputs and parameters from the table (null when the form has no table). */
export function readTable(form, model, meta) {
  const field = form.querySelector("[data-table]");
  const layout = columnsOf(model, meta);
  if (!field || !layout) return null;
  const error = field.querySelector(".field-error");
  const rows = [...field.querySelectorAll("tbody tr")];
  try {
    const values = rows.map((row, r) => [...row.querySelectorAll("input")].map((input, c) =>
      parse(input.value, layout.columns[c].datatype, `${layout.columns[c].name}, row ${r + 1}`)));
    error.hidden = true;
    if (layout.matrix) {
      const { name, datatype } = layout.matrix;
      return { inputs: [{ name, datatype, shape: [rows.length, layout.columns.length], data: values.flat() }] };
    }
    const inputs = layout.columns.map((column, c) => ({
      name: column.name, datatype: column.datatype, shape: [rows.length, 1],
      data: values.map((row) => row[c]),
    }));
    return { inputs, parameters: { content_type: "pd" } };
  } catch (problem) {
    error.textContent = problem.message;
    error.hidden = false;
    throw new Error("fix the highlighted cell");
  }
}
