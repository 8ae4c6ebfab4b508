// Entry point of every dashboard page: first the access token (a page the server rendered
// without it is shown again with it), then live health in the top bar and on the overview,
// then the page's own enhancements. Without a token configured everything here is optional:
// pages are complete without it.
import { announce, gated, initTokenPanel, showPageWith } from "./access.js";
import { accessToken, duration, el, forgetAccessToken, getJSON, poll, timestampMs } from "./common.js";
import { initIndex } from "./index.js";
import { initBenchmark, initModelPage } from "./modelpage.js";
import { initPipeline } from "./pipeline.js";

function bind(name) {
  return document.querySelectorAll(`[data-bind="${name}"]`);
}

function setText(name, text) {
  for (const node of bind(name)) node.textContent = text;
}

function showOverview(o) {
  for (const pill of bind("ready-pill")) {
    pill.textContent = o.ready ? "Ready" : "Starting";
    pill.className = `pill ${o.ready ? "ok" : "warn"}`;
  }
  setText("live", o.live ? "yes" : "no");
  setText("ready", o.ready ? "yes" : "loading models");
  for (const dot of bind("ready-dot")) dot.className = `dot ${o.ready ? "ok" : "warn"}`;
  setText("model-count", String(o.model_count));
  for (const [state, n] of Object.entries(o.models_by_state)) setText(`models-${state}`, String(n));
  setText("problem-count", String(o.problems.length));
  fillList("problems", o.problems, (p) =>
    el("li", {}, el("a", { href: `/models/${encodeURIComponent(p.model)}` }, el("strong", { text: p.model })),
      p.version ? ` version ${p.version}` : "", ": ", el("span", { class: "reason", text: p.message })),
  "Nothing: every model the server was asked to load is serving.");
  setText("error-count", String(o.errors.length));
  fillList("errors", o.errors, (e) =>
    el("li", {}, el("time", { class: "muted small", text: timestamp(e.time) }), " ",
      el("strong", { text: e.source }), " ", el("span", { class: "reason", text: e.message })),
  "No errors since the server started.");
  showWorkers(o.workers || []);
  if (o.payload_log) {
    setText("payload-logged", String(o.payload_log.logged));
    setText("payload-dropped", String(o.payload_log.dropped));
    setText("payload-queue-full", String(o.payload_log.queue_full));
    setText("payload-sink-failed", String(o.payload_log.sink_failed));
  }
}

/** The Workers panel's rows (the panel exists only with several workers and admin access). */
function showWorkers(workers) {
  const signature = JSON.stringify(workers.map(({ uptime_s, ...rest }) => rest)); // uptime ticks
  for (const body of bind("workers")) {
    if (!workers.length || body.dataset.signature === signature) continue;
    body.dataset.signature = signature;
    body.replaceChildren(...workers.map((w) =>
      el("tr", { dataset: { worker: String(w.index) } },
        el("td", { dataset: { label: "Worker" }, text: String(w.index) }),
        el("td", { dataset: { label: "State", col: "state" } }, el("span", {},
          el("span", { class: `dot ${w.state === "serving" ? "ok" : "warn"}`, "aria-hidden": "true" }), w.state)),
        el("td", { class: "num", dataset: { label: "PID", col: "pid" }, text: w.pid ?? "—" }),
        el("td", { dataset: { label: "Uptime", col: "uptime" } }, w.up_since
          ? el("span", { dataset: { bind: "uptime", started: String(w.up_since) }, text: duration(w.uptime_s) })
          : "—"),
        el("td", { class: "num", dataset: { label: "Restarts", col: "restarts" }, text: String(w.restarts) }),
        el("td", { class: "num", dataset: { label: "OK", col: "success" }, text: String(w.success) }),
        el("td", { class: "num", dataset: { label: "Failed", col: "failure" }, text: String(w.failure) }))));
  }
}

/** Re-render a list only when its data changed (so focus inside it survives polling). */
function fillList(name, data, render, empty) {
  const signature = JSON.stringify(data);
  for (const list of bind(name)) {
    if (list.dataset.signature === signature) continue;
    list.dataset.signature = signature;
    list.replaceChildren(...(data.length ? data.map(render) : [el("li", { class: "muted", text: empty })]));
  }
}

function timestamp(seconds) {
  return seconds ? timestampMs(seconds * 1000) : "—";
}

function showOffline() {
  for (const pill of bind("ready-pill")) {
    pill.textContent = "Unreachable";
    pill.className = "pill bad";
  }
}

function tickUptime() {
  for (const node of bind("uptime")) {
    const started = Number(node.dataset.started);
    if (started) node.textContent = duration(Date.now() / 1000 - started);
  }
}

async function start() {
  let refused = false;
  if (accessToken() && gated().length) {
    const shown = await showPageWith(accessToken()).catch(() => false);
    refused = !shown && gated().includes("metadata");
    if (refused) forgetAccessToken(); // e.g. the server now has another token
  }
  initTokenPanel();
  if (refused) announce("The server refused the token kept in this tab: enter it again.", true);
  if (gated().includes("metadata")) return; // the locked shell: nothing else to show
  tickUptime();
  setInterval(tickUptime, 1000);
  poll(async () => {
    const overview = await getJSON("/dashboard/api/overview");
    if (overview) showOverview(overview);
    else showOffline();
  }, 3000);
  initIndex();
  initModelPage();
  initBenchmark();
  initPipeline();
  if (document.getElementById("try-form")) (await import("./tryit.js")).initTry();
  if (document.getElementById("openai-try")) (await import("./tryit-openai.js")).initOpenAI();
}

start();
