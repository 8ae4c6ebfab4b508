// Try-it-out on the OpenAI-compatible routes, for models serve.yaml marks `openai:`: a chat
// (POST /openai/v1/chat/completions with stream: true, the answer shown as its chunks arrive),
// a completion (POST /openai/v1/completions, streamed the same way: shown for a generator model,
// whose V2 infer route answers 501) or embeddings (POST /openai/v1/embeddings). Same origin,
// the tab's token, as the V2 form.
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

/** Send one streamed request and show its text as it arrives: the text, and the message of
 * an error the stream ended with ("" if none); throws when the request is refused. */
async function streamed(path, body, user) {
  const asked = bubble("user", user);
  const answer = bubble("assistant", "");
  const response = await fetch(path, {
    method: "POST", headers: withToken({ "Content-Type": "application/json" }),
    body: JSON.stringify({ model: section.dataset.model, stream: true, ...body }),
    signal: AbortSignal.timeout(120000),
  });
  if (!response.ok) {
    asked.parentElement.remove();
    answer.parentElement.remove();
    throw new Error(`HTTP ${response.status}: ${await failure(response)}`);
  }
  let failed = "";
  await readEvents(response, (data) => {
    if (data === "[DONE]") return;
    const chunk = JSON.parse(data);
    if (chunk.error) failed = chunk.error.message;
    for (const choice of chunk.choices || []) {
      const piece = choice.delta ? choice.delta.content : choice.text;
      if (piece) answer.textContent += piece;
    }
  });
  answer.parentElement.dataset.done = "true";
  return { text: answer.textContent, failed };
}

async function chat(text) {
  history.push({ role: "user", content: text });
  let answer;
  try {
    answer = await streamed("/openai/v1/chat/completions", { messages: history }, text);
  } catch (problem) {
    history.pop();
    throw problem;
  }
  history.push({ role: "assistant", content: answer.text });
  if (answer.failed) throw new Error(answer.failed);
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
      } else if (section.dataset.kind === "completion") {
        const { failed } = await streamed("/openai/v1/completions", { prompt: text }, text);
        if (failed) throw new Error(failed);
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
