// The access token, when the server asks for one (the design is in app/servekit/dashboard/viewer.py).
// One field; the token lives in this tab's sessionStorage and goes out only as
// "Authorization: Bearer" on the dashboard's own requests. A page the server rendered without
// it says so on <body data-gated="metadata admin">: with a token, the page is fetched again
// with the header and shown in place, so the server alone decides what the token opens.
import { accessToken, forgetAccessToken, keepAccessToken, withToken } from "./common.js";

/** Dispatched on document when the kept token changes: detail {message, error}. */
export const TOKEN_EVENT = "servekit:token";

const words = (text) => (text || "").split(" ").filter(Boolean);

/** Protected groups the server left out of a page (of this document by default). */
export function gated(doc = document) {
  return words(doc.body && doc.body.dataset.gated);
}

export function isProtected(group) {
  return words(document.body.dataset.protected).includes(group);
}

/** Whether load/unload exist on this server but need the repository token. */
export function controlsNeedToken() {
  return document.body.dataset.modelControl === "explicit" && isProtected("repository");
}

/** This page as the server renders it for ``token``; null when refused or not a page. */
async function pageWith(token) {
  const response = await fetch(location.href, {
    headers: withToken({ Accept: "text/html" }, token), cache: "no-store",
    signal: AbortSignal.timeout(15000),
  });
  const html = (response.headers.get("content-type") || "").startsWith("text/html");
  if (response.status === 401 || !html) return null;
  return new DOMParser().parseFromString(await response.text(), "text/html");
}

/** Show this page as ``token`` opens it, when that is more than it shows now. */
export async function showPageWith(token) {
  const before = gated().length;
  const page = await pageWith(token);
  if (!page || gated(page).length >= before) return false;
  // Parsed documents never run scripts; ours are already loaded and initialise the new body.
  document.title = page.title;
  document.body.replaceWith(document.adoptNode(page.body));
  return true;
}

/** Whether the repository API takes ``token`` (the index: it reads, changes nothing). */
export async function repositoryAccepts(token = accessToken()) {
  try {
    const response = await fetch("/v2/repository/index", {
      method: "POST", headers: withToken({ "Content-Type": "application/json" }, token),
      body: "{}", cache: "no-store", signal: AbortSignal.timeout(15000),
    });
    return response.ok;
  } catch {
    return false;
  }
}

/** "reload" (the token opens more of this page), "accepted" or "refused". */
async function verdict(token) {
  let refused = false;
  if (gated().length) {
    const page = await pageWith(token).catch(() => null);
    if (page && gated(page).length < gated().length) return "reload";
    refused = true;
  }
  if (controlsNeedToken()) {
    if (await repositoryAccepts(token)) return "accepted";
    refused = true;
  }
  // Nothing here can check it (e.g. only inference needs it): the first use will tell.
  return refused ? "refused" : "accepted";
}

export function announce(message, error = false) {
  document.dispatchEvent(new CustomEvent(TOKEN_EVENT, { detail: { message, error } }));
}

/** "Forget token" in the top bar while a token is kept; the panel: a form while none is. */
export function initTokenPanel() {
  const forget = document.querySelector("[data-token-forget]");
  forget.hidden = !accessToken();
  forget.addEventListener("click", () => {
    forgetAccessToken();
    location.reload();
  });
  document.addEventListener(TOKEN_EVENT, () => (forget.hidden = !accessToken()));
  const panel = document.querySelector("[data-token-panel]");
  if (!panel) return;
  const form = panel.querySelector("[data-token-form]");
  const held = panel.querySelector("[data-token-held]");
  const message = panel.querySelector("[data-token-msg]");
  const input = form.querySelector("input");
  const button = form.querySelector("button");
  const say = (text, error) => {
    message.textContent = text || "";
    message.className = `token-msg small${error ? " error" : ""}`;
  };
  const sync = () => {
    const kept = Boolean(accessToken());
    form.hidden = kept;
    held.hidden = !kept;
  };
  sync();
  document.addEventListener(TOKEN_EVENT, (event) => {
    sync();
    say(event.detail.message, event.detail.error);
  });
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const token = input.value.trim();
    if (!token) return;
    button.disabled = true;
    say("Checking the token…");
    let result;
    try {
      result = await verdict(token);
    } catch (problem) {
      result = "refused";
    }
    button.disabled = false;
    if (result === "refused") {
      say("The server refused this token.", true);
      input.select();
      return;
    }
    input.value = "";
    keepAccessToken(token);
    if (result === "reload") location.reload();
    else announce("Token accepted.");
  });
}
