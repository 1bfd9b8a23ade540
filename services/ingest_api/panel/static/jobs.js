// The job list: status, progress and times, refreshed in place every few seconds, with a
// search (name, id or metadata), a status filter, pages (newest first), a Cancel button on
// jobs that can still stop, and a selection to cancel or delete several jobs at once.

import { api } from "./api.js";
import { ACTIONS, confirmBulk, runBulk } from "./bulk.js";
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
const SEARCH_DELAY_MS = 300;

const state = {
  cursors: [null], page: [], hasMore: false, generation: 0, shown: "", selected: new Map(),
  searchTimer: null,
};

/** What the last bulk action did (the line is hidden while empty). */
function note(text) {
  setText("bulk-note", text);
  document.getElementById("bulk-note").hidden = !text;
}

function toggle(batch, on) {
  if (on) state.selected.set(batch.id, batch);
  else state.selected.delete(batch.id);
  render();
}

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
  const selected = state.selected.has(batch.id);
  return h(
    "tr",
    { dataset: { jobId: batch.id }, class: selected ? "selected" : null },
    h(
      "td",
      { class: "select actions" },
      h("input", {
        type: "checkbox",
        checked: selected,
        "aria-label": `Select ${batch.name}`,
        dataset: { focusKey: `select-${batch.id}` },
        onchange: (event) => toggle(batch, event.target.checked),
      }),
    ),
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

function renderBulk() {
  const chosen = [...state.selected.values()];
  document.getElementById("bulk-bar").hidden = chosen.length === 0;
  setText("bulk-count", `${chosen.length} selected`);
  for (const kind of ["cancel", "delete"]) {
    const n = chosen.filter(ACTIONS[kind].applies).length;
    const button = document.getElementById(`bulk-${kind}`);
    button.disabled = n === 0;
    button.textContent = `${ACTIONS[kind].verb} ${n} selected`;
  }
  const all = document.getElementById("select-page");
  const onPage = state.page.filter((b) => state.selected.has(b.id)).length;
  all.checked = state.page.length > 0 && onPage === state.page.length;
  all.indeterminate = onPage > 0 && onPage < state.page.length;
}

function render() {
  for (const batch of state.page) {
    if (state.selected.has(batch.id)) state.selected.set(batch.id, batch); // fresh status
  }
  renderBulk();
  const snapshot = JSON.stringify([state.page, [...state.selected.keys()]]);
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
  const search = document.getElementById("job-search").value.trim();
  const after = state.cursors[state.cursors.length - 1];
  if (status) params.status = status;
  if (search) params.search = search;
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

async function bulk(kind) {
  const chosen = [...state.selected.values()].filter(ACTIONS[kind].applies);
  if (!chosen.length || !(await confirmBulk(kind, chosen))) return;
  note(`${ACTIONS[kind].verb}ing ${chosen.length}…`);
  const said = await runBulk(kind, chosen);
  for (const batch of chosen) state.selected.delete(batch.id);
  note(said);
  restart();
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
  document.getElementById("job-search").addEventListener("input", () => {
    clearTimeout(state.searchTimer);
    state.searchTimer = setTimeout(() => {
      state.cursors = [null];
      restart();
    }, SEARCH_DELAY_MS);
  });
  document.getElementById("select-page").addEventListener("change", (event) => {
    for (const batch of state.page) {
      if (event.target.checked) state.selected.set(batch.id, batch);
      else state.selected.delete(batch.id);
    }
    render();
  });
  document.getElementById("bulk-cancel").addEventListener("click", () => bulk("cancel"));
  document.getElementById("bulk-delete").addEventListener("click", () => bulk("delete"));
  document.getElementById("bulk-clear").addEventListener("click", () => {
    state.selected.clear();
    note("");
    render();
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
