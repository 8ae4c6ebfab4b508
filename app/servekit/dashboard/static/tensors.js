// Tensor values for the try-it-out form: example/random/zero fills, parsing what the user typed
// (JSON, nested or flat, or numbers separated by commas, spaces or new lines; one string per
// line for BYTES) and turning an uploaded image into a UINT8 tensor.

const INT_RANGES = {
  INT8: [-128, 127], INT16: [-32768, 32767], INT32: [-2147483648, 2147483647],
  INT64: [-1e6, 1e6], UINT8: [0, 255], UINT16: [0, 65535], UINT32: [0, 4294967295], UINT64: [0, 1e6],
};
const FLOATS = new Set(["FP16", "FP32", "FP64", "BF16"]);

export const isFloat = (dt) => FLOATS.has(dt);
export const isInt = (dt) => dt in INT_RANGES;
export const isNumeric = (dt) => isFloat(dt) || isInt(dt);

/** The model's shape with every dynamic dimension (-1) set to 1. */
export function concreteShape(shape) {
  return shape.map((d) => (d < 0 ? 1 : d));
}

export function count(shape) {
  return shape.reduce((a, b) => a * b, 1);
}

/** A small deterministic example that every model of this signature accepts. */
export function example(datatype, n) {
  const words = ["hello", "world", "servekit", "tensor"];
  return Array.from({ length: n }, (_, i) => {
    if (datatype === "BYTES") return words[i % words.length];
    if (datatype === "BOOL") return i % 2 === 0;
    if (isFloat(datatype)) return ((i % 9) - 4) / 4;
    return i % 10;
  });
}

export function random(datatype, n) {
  return Array.from({ length: n }, () => {
    if (datatype === "BYTES") return Math.random().toString(36).slice(2, 8);
    if (datatype === "BOOL") return Math.random() < 0.5;
    if (isFloat(datatype)) return Math.round((Math.random() * 2 - 1) * 1e4) / 1e4;
    const [lo, hi] = INT_RANGES[datatype];
    const top = Math.min(hi, lo + 1000);
    return lo + Math.floor(Math.random() * (top - lo + 1));
  });
}

export function zeros(datatype, n) {
  return Array.from({ length: n }, () => (datatype === "BYTES" ? "" : datatype === "BOOL" ? false : 0));
}

/** Text for the editor: nested JSON with one innermost row per line (strings: one per line). */
export function format(values, shape, datatype) {
  if (datatype === "BYTES") {
    return values.some((v) => v.includes("\n") || v === "") ? JSON.stringify(values) : values.join("\n");
  }
  if (values.length > 4096) {
    // Large tensors (images): plain lines of numbers, far lighter for the editor than JSON.
    const lines = [];
    for (let i = 0; i < values.length; i += 48) lines.push(values.slice(i, i + 48).join(", "));
    return lines.join("\n");
  }
  if (shape.length <= 1) return `[${values.map(String).join(", ")}]`;
  const nest = (offset, dims, indent) => {
    if (dims.length === 1) return `[${values.slice(offset, offset + dims[0]).map(String).join(", ")}]`;
    const step = count(dims.slice(1));
    const parts = [];
    for (let i = 0; i < dims[0]; i++) parts.push(nest(offset + i * step, dims.slice(1), indent + " "));
    return `[${parts.join(`,\n${indent} `)}]`;
  };
  return nest(0, shape, "");
}

/** Shape text "1, 16" -> [1, 16]; throws with a readable message. */
export function parseShape(text) {
  const parts = text.split(/[\s,[\]x×]+/).filter(Boolean);
  const dims = parts.map(Number);
  if (dims.some((d) => !Number.isInteger(d) || d < 0)) {
    throw new Error(`shape "${text}" must be non-negative whole numbers separated by commas`);
  }
  return dims;
}

function nestedShape(value) {
  const dims = [];
  let level = value;
  while (Array.isArray(level)) {
    dims.push(level.length);
    level = level[0];
  }
  return dims;
}

function coerce(value, datatype, position) {
  if (datatype === "BYTES") return typeof value === "string" ? value : JSON.stringify(value);
  if (datatype === "BOOL") {
    if (value === true || value === "true" || value === 1 || value === "1") return true;
    if (value === false || value === "false" || value === 0 || value === "0") return false;
    throw new Error(`value ${position + 1} ("${value}") is not true/false`);
  }
  const number = typeof value === "number" ? value : Number(value);
  if (typeof value === "boolean" || value === "" || !Number.isFinite(number)) {
    throw new Error(`value ${position + 1} ("${value}") is not a number`);
  }
  return number;
}

/** Parse the editor's text. JSON nested to the model's rank gives the values' own shape;
 * ``disagrees`` says it is not Shape's: the form refuses that (checkNesting), never rewriting
 * Shape and sending (issue 27). */
export function parseValues(text, datatype, shape, rank) {
  const trimmed = text.trim();
  let raw;
  let effective = shape;
  let disagrees = false;
  if (trimmed.startsWith("[")) {
    let parsed;
    try {
      parsed = JSON.parse(trimmed);
    } catch (error) {
      throw new Error(`not valid JSON: ${error.message}`);
    }
    const nested = nestedShape(parsed);
    raw = parsed.flat(Infinity);
    const agrees = nested.length === shape.length && nested.every((d, i) => d === shape[i]);
    if (nested.length === rank && nested.length > 1 && count(nested) === raw.length && !agrees) {
      effective = nested;
      disagrees = true;
    }
  } else if (datatype === "BYTES") {
    raw = trimmed === "" ? [] : text.replace(/\n$/, "").split("\n");
  } else {
    raw = trimmed === "" ? [] : trimmed.split(/[\s,;]+/).filter(Boolean);
  }
  return { values: raw.map((v, i) => coerce(v, datatype, i)), shape: effective, disagrees };
}

/** Refuse, before sending, a shape the model cannot take or values that do not fill it: the
 * rank and every fixed dimension of ``declared`` (the model's metadata, -1 = free) must match. */
export function checkShape(shape, declared, valueCount) {
  const shown = (dims) => `[${dims.join(", ")}]`;
  if (shape.length !== declared.length) {
    throw new Error(`shape ${shown(shape)} has ${shape.length} dimension(s); the model takes ${declared.length}: ${shown(declared)}`);
  }
  declared.forEach((d, i) => {
    if (d >= 0 && shape[i] !== d) {
      throw new Error(`shape ${shown(shape)}: dimension ${i + 1} must be ${d} (the model takes ${shown(declared)})`);
    }
  });
  const needed = count(shape);
  if (needed !== valueCount) {
    throw new Error(`${valueCount} value(s) for shape ${shown(shape)}, which holds ${needed}`);
  }
}

/** Refuse values nested otherwise than Shape says (after ``checkShape``, so the model's own
 * rule is said first when both are broken). */
export function checkNesting(nested, typed) {
  throw new Error(`the values are nested as [${nested.join(", ")}] but Shape says ` +
    `[${typed.join(", ")}]: set Shape to ${nested.join(", ")} or change the values`);
}

/** Layout of an image-shaped UINT8 input, or null: channels last (HWC) or first (CHW). */
export function imageLayout(datatype, shape) {
  if (datatype !== "UINT8" || shape.length < 3 || shape.length > 4) return null;
  const s = shape.slice(-3);
  if (shape.length === 4 && shape[0] > 1) return null;
  const channel = (d) => d === 1 || d === 3 || d === 4;
  if (channel(s[2]) && s[0] !== 1 && s[1] !== 1) return { order: "HWC", h: s[0], w: s[1], c: s[2] };
  if (channel(s[0]) && s[1] !== 1 && s[2] !== 1) return { order: "CHW", h: s[1], w: s[2], c: s[0] };
  return null;
}

/** Decode an image file to UINT8 values laid out as the model wants (dynamic H/W: its size). */
export async function imageTensor(file, layout, rank) {
  const bitmap = await createImageBitmap(file);
  const scale = Math.min(1, 512 / Math.max(bitmap.width, bitmap.height));
  const h = layout.h > 0 ? layout.h : Math.max(1, Math.round(bitmap.height * scale));
  const w = layout.w > 0 ? layout.w : Math.max(1, Math.round(bitmap.width * scale));
  const c = layout.c > 0 ? layout.c : 3;
  const canvas = document.createElement("canvas");
  canvas.width = w;
  canvas.height = h;
  const context = canvas.getContext("2d", { willReadFrequently: true });
  context.drawImage(bitmap, 0, 0, w, h);
  const rgba = context.getImageData(0, 0, w, h).data;
  const values = new Array(h * w * c);
  const gray = (p) => Math.round(0.299 * rgba[p] + 0.587 * rgba[p + 1] + 0.114 * rgba[p + 2]);
  for (let y = 0; y < h; y++) {
    for (let x = 0; x < w; x++) {
      const p = (y * w + x) * 4;
      for (let k = 0; k < c; k++) {
        const v = c === 1 ? gray(p) : rgba[p + k];
        const index = layout.order === "HWC" ? (y * w + x) * c + k : k * h * w + y * w + x;
        values[index] = v;
      }
    }
  }
  const dims = layout.order === "HWC" ? [h, w, c] : [c, h, w];
  return { values, shape: rank === 4 ? [1, ...dims] : dims };
}
