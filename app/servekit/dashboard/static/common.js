// Helpers shared by the dashboard's scripts. No framework: DOM built with textContent only,
// so model names and server messages can never inject markup.

/** Create an element: el("td", {class: "num", dataset: {col: "x"}}, "text", child). */
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "dataset") Object.assign(node.dataset, value);
    else if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

/** The server's error message of a failed response ({"error": ...} when it is ours). */
export async function readError(response) {
  const text = await response.text();
  try {
    const body = JSON.parse(text);
    if (body && typeof body.error === "string") return body.error;
  } catch {
    /* not JSON: fall through to the raw text */
  }
  return text.trim() || `${response.status} ${response.statusText}`;
}

const TOKEN_KEY = "servekit.accessToken";

/** The access token typed into this tab ("" if none). Only sessionStorage holds it: never a
 * cookie (it would ride along on cross-site requests) and never a URL (logs, history). */
export function accessToken() {
  try {
    return sessionStorage.getItem(TOKEN_KEY) || "";
  } catch {
    return "";
  }
}

export function keepAccessToken(token) {
  sessionStorage.setItem(TOKEN_KEY, token);
}

export function forgetAccessToken() {
  sessionStorage.removeItem(TOKEN_KEY);
  sessionStorage.removeItem("servekit.adminToken"); // the benchmark's own (modelpage.js)
}

/** ``headers`` plus ``Authorization: Bearer`` when there is a token (the kept one by default). */
export function withToken(headers = {}, token = accessToken()) {
  return token ? { ...headers, Authorization: `Bearer ${token}` } : { ...headers };
}

/** GET a dashboard JSON document with a bounded wait; null when the server does not answer. */
export async function getJSON(url, timeoutMs = 5000) {
  try {
    const response = await fetch(url, {
      headers: withToken(), signal: AbortSignal.timeout(timeoutMs), cache: "no-store",
    });
    return response.ok ? await response.json() : null;
  } catch {
    return null;
  }
}

/** Call ``task`` every ``ms`` while the page is visible (never two at once). */
export function poll(task, ms) {
  let timer = null;
  const run = async () => {
    timer = null;
    if (!document.hidden) await task();
    timer = setTimeout(run, ms);
  };
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden && timer !== null) {
      clearTimeout(timer);
      run();
    }
  });
  timer = setTimeout(run, ms);
}

/** Same wording as the server-side "duration" filter. */
export function duration(seconds) {
  const total = Math.max(0, Math.floor(seconds));
  const d = Math.floor(total / 86400), h = Math.floor((total % 86400) / 3600);
  const m = Math.floor((total % 3600) / 60), s = total % 60;
  const two = (n) => String(n).padStart(2, "0");
  if (d) return `${d}d ${two(h)}h`;
  if (h) return `${h}h ${two(m)}m`;
  if (m) return `${m}m ${two(s)}s`;
  return `${s}s`;
}

/** Same wording as the server-side "ms" filter. */
export function ms(value) {
  if (value === null || value === undefined) return "—";
  return value < 10 ? value.toFixed(3) : value.toFixed(1);
}

/** Same wording as the server-side "timestamp" filter (epoch milliseconds in). */
export function timestampMs(epochMs) {
  if (!epochMs) return "—";
  return new Date(epochMs).toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
}

/** Copy text to the clipboard; falls back to a selection copy outside secure contexts. */
export async function copyText(text) {
  if (navigator.clipboard && window.isSecureContext) {
    await navigator.clipboard.writeText(text);
    return;
  }
  const area = el("textarea", { readonly: true, class: "copy-buffer" });
  area.value = text;
  document.body.append(area);
  area.select();
  document.execCommand("copy");
  area.remove();
}
