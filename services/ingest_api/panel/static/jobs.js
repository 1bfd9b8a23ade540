// The job list: status, progress and times, refreshed in place every few seconds, with a
// status filter, pages (newest first) and a Cancel button on jobs that can still stop.

import { api } from "./api.js";
import { confirmCancel } from "./cancel.js";
import {
  CANCELABLE,
  fill,
  focusKey,
  h,
  jobBadge,
  progressBar,
  progressText,
  restoreFocus,
  setText,
  timeEl,
} from "./dom.js";

const PAGE_SIZE = 20;
const POLL_MS = 1500;

const state = { cursors: [null], page: [], hasMore: false, generation: 0, shown: "" };

function jobRow(batch) {
  const label = `Progress of ${batch.name}`;
  const cancel = CANCELABLE.has(batch.status)
    ? h(
        "button",
        {
          type: "button",
          class: "danger small",
          "aria-label": `Cancel ${batch.name}`,
          dataset: { focusKey: `cancel-${batch.id}` },
          onclick: () => cancelJob(batch),
        },
        "Cancel",
      )
    : null;
  return h(
    "tr",
    { dataset: { jobId: batch.id } },
    h(
      "td",
      {},
      h("a", { href: `#/jobs/${batch.id}`, dataset: { focusKey: `open-${batch.id}` } }, batch.name),
    ),
    h("td", {}, jobBadge(batch)),
    h("td", {}, batch.model),
    h("td", { class: "num" }, String(batch.priority)),
    h(
      "td",
      { class: "progress-cell" },
      progressBar(batch, label),
      h("span", { class: "progress-text" }, progressText(batch)),
    ),
    h("td", {}, timeEl(batch.created_at)),
    h("td", {}, timeEl(batch.completed_at)),
    h("td", { class: "actions" }, cancel),
  );
}

function render() {
  const snapshot = JSON.stringify(state.page);
  if (snapshot !== state.shown) {
    const key = focusKey();
    fill(document.getElementById("jobs-body"), state.page.map(jobRow));
    restoreFocus(key);
    state.shown = snapshot;
  }
  document.getElementById("jobs-empty").hidden = state.page.length > 0;
  document.getElementById("jobs-newer").disabled = state.cursors.length <= 1;
  document.getElementById("jobs-older").disabled = !state.hasMore;
}

async function load(generation) {
  const params = { limit: String(PAGE_SIZE) };
  const status = document.getElementById("status-filter").value;
  const after = state.cursors[state.cursors.length - 1];
  if (status) params.status = status;
  if (after) params.after = after;
  const page = await api.list(params);
  if (generation !== state.generation) return; // the filter or page changed meanwhile
  state.page = page.data;
  state.hasMore = page.has_more;
  setText("jobs-error", "");
  render();
}

async function refresh(generation) {
  try {
    await load(generation);
  } catch (err) {
    setText("jobs-error", `Could not load jobs: ${err.message}`);
  }
  if (generation === state.generation) {
    setTimeout(() => generation === state.generation && refresh(generation), POLL_MS);
  }
}

async function cancelJob(batch) {
  try {
    if (await confirmCancel(batch)) await load(state.generation);
  } catch (err) {
    setText("jobs-error", `Could not cancel "${batch.name}": ${err.message}`);
  }
}

function restart() {
  state.generation += 1;
  state.shown = "";
  refresh(state.generation);
}

/** Wire the controls once at start-up. */
export function setupJobs() {
  document.getElementById("status-filter").addEventListener("change", () => {
    state.cursors = [null];
    restart();
  });
  document.getElementById("jobs-older").addEventListener("click", () => {
    if (!state.hasMore || !state.page.length) return;
    state.cursors.push(state.page[state.page.length - 1].id);
    restart();
  });
  document.getElementById("jobs-newer").addEventListener("click", () => {
    if (state.cursors.length > 1) state.cursors.pop();
    restart();
  });
}

/** Show the list and keep it live until stopJobs(). */
export function startJobs() {
  restart();
}

/** Stop refreshing (the view is hidden). */
export function stopJobs() {
  state.generation += 1;
}
