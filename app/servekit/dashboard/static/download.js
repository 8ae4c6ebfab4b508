// A remote model's download in the repository index: a LOADING row whose reason says the bytes,
// rate and time left (the server words it) gets a progress bar beside it. The row data comes from
// /dashboard/api/models (its "download" field), refreshed every few seconds by index.js.
import { el } from "./common.js";

/** A space and the progress bar of a row whose model is being downloaded, or null. */
export function downloadBar(row) {
  const download = row.download;
  if (!download || download.percent === null || download.percent === undefined) return null;
  return [" ", el("progress", { max: "100", value: String(download.percent), dataset: { col: "download" },
    text: `${download.percent}%` })];
}
