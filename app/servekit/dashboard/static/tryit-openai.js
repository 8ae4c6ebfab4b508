// Try-it-out on the OpenAI-compatible routes, for models serve.yaml marks `openai:`: a chat
// (POST /openai/v1/chat/completions with stream: true, the answer shown as its chunks arrive)
// or embeddings (POST /openai/v1/embeddings). Same origin, the tab's token, as the V2 form.
import { el, withToken } from "./common.js";

let section;
const history = [];

function show(message) {
  const error = document.getElementById("openai-error");
  error.textContent = message;
  error.hidden = !message;
}

async function failure(response) {
  const text = await response.text();
  try {
    const body = JSON.parse(text);
    if (body && body.error && typeof body.error.message === "string") return body.error.message;
  } catch {
    /* not JSON: the raw text */
  }
  return text.trim() || `${response.status} ${response.statusText}`;
}

function bubble(role, text) {
  const line = el("div", { class: `chat-line ${role}`, dataset: { role } },
    el("span", { class: "chat-role", text: role === "user" ? "You" : "Model" }),
    el("span", { class: "chat-text", text }));
  document.getElementById("openai-transcript").append(line);
  return line.querySelector(".chat-text");
}

/** Server-Sent Events from a fetch body: calls ``onData`` with each event's data. */
async function readEvents(response, onData) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let pending = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    pending += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = pending.indexOf("\n\n")) >= 0) {
      const event = pending.slice(0, cut);
      pending = pending.slice(cut + 2);
      for (const line of event.split("\n")) {
        if (line.startsWith("data: ")) onData(line.slice(6));
      }
    }
  }
}

async function chat(text) {
  history.push({ role: "user", content: text });
  bubble("user", text);
  const answer = bubble("assistant", "");
  const response = await fetch("/openai/v1/chat/completions", {
    method: "POST", headers: withToken({ "Content-Type": "application/json" }),
    body: JSON.stringify({ model: section.dataset.model, messages: history, stream: true }),
    signal: AbortSignal.timeout(120000),
  });
  if (!response.ok) {
    history.pop();
    answer.parentElement.remove();
    throw new Error(`HTTP ${response.status}: ${await failure(response)}`);
  }
  let failed = "";
  await readEvents(response, (data) => {
    if (data === "[DONE]") return;
    const chunk = JSON.parse(data);
    if (chunk.error) failed = chunk.error.message;
    for (const choice of chunk.choices || []) {
      if (choice.delta && choice.delta.content) answer.textContent += choice.delta.content;
    }
  });
  section.querySelector(".chat-line:last-child").dataset.done = "true";
  history.push({ role: "assistant", content: answer.textContent });
  if (failed) throw new Error(failed);
}

async function embed(text) {
  const response = await fetch("/openai/v1/embeddings", {
    method: "POST", headers: withToken({ "Content-Type": "application/json" }),
    body: JSON.stringify({ model: section.dataset.model, input: text, encoding_format: "float" }),
    signal: AbortSignal.timeout(120000),
  });
  if (!response.ok) throw new Error(`HTTP ${response.status}: ${await failure(response)}`);
  const vector = (await response.json()).data[0].embedding;
  const norm = Math.sqrt(vector.reduce((sum, x) => sum + x * x, 0));
  const head = vector.slice(0, 8).map((x) => x.toFixed(4)).join(", ");
  const out = document.getElementById("openai-transcript");
  out.replaceChildren(
    el("p", { id: "openai-dimensions", text: `${vector.length} dimensions, length ${norm.toFixed(4)}` }),
    el("pre", { class: "code", text: `[${head}${vector.length > 8 ? ", …" : ""}]` }));
}

export function initOpenAI() {
  section = document.getElementById("openai-try");
  const form = document.getElementById("openai-form");
  const input = document.getElementById("openai-text");
  const button = document.getElementById("openai-send");
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const text = input.value.trim();
    if (!text) return;
    show("");
    button.disabled = true;
    button.setAttribute("aria-busy", "true");
    try {
      if (section.dataset.kind === "chat") {
        input.value = "";
        await chat(text);
      } else {
        await embed(text);
      }
    } catch (problem) {
      show(problem.message);
    } finally {
      button.disabled = false;
      button.removeAttribute("aria-busy");
    }
  });
  form.hidden = false;
}
