// The job page: counters and progress (live until the job ends), details, usage, results
// (first rows, paged, read from the ndjson stream), dead letters, downloads, and for a cron
// template its next run and its runs.

import { api, streamResults } from "./api.js";
import { confirmCancel } from "./cancel.js";
import { downloadResults } from "./export.js";
import {
  CANCELABLE,
  TERMINAL,
  fill,
  h,
  percent,
  progressText,
  setText,
  statusBadge,
  timeEl,
} from "./dom.js";

const POLL_MS = 1000;
const RESULTS_PAGE = 25;
const DEAD_LETTERS_SHOWN = 100;
const RUN_SCAN_PAGES = 5; // runs are found among the newest 500 jobs of the workspace
const RUNS_EVERY_POLLS = 10;

const state = { id: null, batch: null, generation: 0, page: 0, resultsFor: null, polls: 0 };

function detail(term, value) {
  return [h("dt", {}, term), h("dd", {}, value)];
}

function renderBatch(batch) {
  setText("job-title", batch.name);
  fill(document.getElementById("job-status"), statusBadge(batch.status));
  document.getElementById("job-cancel").hidden = !CANCELABLE.has(batch.status);
  const bar = document.getElementById("job-progress");
  bar.value = percent(batch);
  setText("job-progress-label", progressText(batch));
  setText("count-total", batch.total);
  setText("count-completed", batch.completed);
  setText("count-failed", batch.failed);
  setText("count-dead", batch.dead_letter);
  const template = batch.template_id
    ? h("a", { href: `#/jobs/${batch.template_id}` }, batch.template_id)
    : null;
  fill(
    document.getElementById("job-details"),
    detail("ID", h("code", {}, batch.id)),
    detail("Model", batch.model),
    detail("Priority", String(batch.priority)),
    detail("Created", timeEl(batch.created_at)),
    detail("Started", timeEl(batch.started_at)),
    detail("Finished", timeEl(batch.completed_at)),
    batch.expires_at ? detail("Expires", timeEl(batch.expires_at)) : [],
    batch.error ? detail("Error", batch.error) : [],
    batch.cron ? detail("Cron", h("code", {}, batch.cron)) : [],
    batch.cron ? detail("Next run", timeEl(batch.next_run_at)) : [],
    template ? detail("Template", template) : [],
    batch.metadata ? detail("Metadata", metadataList(batch.metadata)) : [],
  );
  renderUsage(batch.usage);
  const terminal = TERMINAL.has(batch.status);
  document.getElementById("download-jsonl").disabled = !terminal;
  document.getElementById("download-csv").disabled = !terminal;
  document.getElementById("runs-section").hidden = !batch.cron;
}

function metadataList(metadata) {
  return h("ul", { class: "metadata" },
    Object.entries(metadata).map(([k, v]) => h("li", {}, h("code", {}, k), " ", v)));
}

function renderUsage(usage) {
  const section = document.getElementById("usage-section");
  const entries = usage && typeof usage === "object" ? Object.entries(usage) : [];
  section.hidden = entries.length === 0;
  fill(
    document.getElementById("job-usage"),
    ...entries.map(([k, v]) => detail(k.replaceAll("_", " "), String(v))),
  );
}

function resultCell(row) {
  if (row.error !== undefined && row.error !== null) {
    return h("td", { class: "error-text" }, row.error);
  }
  return h("td", {}, row.content ?? "");
}

async function loadResults(generation) {
  const first = state.page * RESULTS_PAGE;
  const rows = [];
  let more = false;
  await streamResults(state.id, (row, index) => {
    if (index < first) return true;
    if (rows.length === RESULTS_PAGE) {
      more = true;
      return false;
    }
    rows.push([index, row]);
    return true;
  });
  if (generation !== state.generation) return;
  fill(
    document.getElementById("results-body"),
    rows.map(([i, row]) => h("tr", {}, h("td", { class: "num" }, String(i + 1)),
      h("td", {}, row.custom_id), resultCell(row))),
  );
  document.getElementById("results-table").hidden = rows.length === 0;
  setText("results-note", rows.length ? "" : "No results.");
  setText("results-page", rows.length ? `Rows ${first + 1}–${first + rows.length}` : "");
  document.getElementById("results-prev").disabled = state.page === 0;
  document.getElementById("results-next").disabled = !more;
}

async function loadDeadLetters(generation) {
  const { data } = await api.deadLetters(state.id);
  if (generation !== state.generation) return;
  const shown = data.slice(0, DEAD_LETTERS_SHOWN);
  fill(
    document.getElementById("dead-body"),
    shown.map((r) => h("tr", {}, h("td", {}, r.custom_id), h("td", { class: "error-text" }, r.error),
      h("td", { class: "num" }, String(r.attempts)))),
  );
  document.getElementById("dead-table").hidden = shown.length === 0;
  const more = data.length > shown.length ? ` (showing the first ${shown.length} of ${data.length})` : "";
  setText("dead-note", data.length ? more : "No dead letters.");
}

async function loadRuns(generation) {
  const runs = [];
  let after = null;
  for (let i = 0; i < RUN_SCAN_PAGES; i += 1) {
    const page = await api.list(after ? { limit: "100", after } : { limit: "100" });
    runs.push(...page.data.filter((b) => b.template_id === state.id));
    if (!page.has_more || !page.data.length) break;
    after = page.data[page.data.length - 1].id;
  }
  if (generation !== state.generation) return;
  fill(
    document.getElementById("job-runs"),
    runs.length
      ? runs.map((r) => h("li", {}, h("a", { href: `#/jobs/${r.id}` }, r.name), " ",
          statusBadge(r.status), " ", timeEl(r.created_at)))
      : h("li", { class: "muted" }, "No runs yet."),
  );
}

async function poll(generation) {
  try {
    const batch = await api.get(state.id);
    if (generation !== state.generation) return;
    state.batch = batch;
    renderBatch(batch);
    setText("job-error", "");
    if (TERMINAL.has(batch.status) && state.resultsFor !== batch.status) {
      state.resultsFor = batch.status;
      await Promise.all([loadResults(generation), loadDeadLetters(generation)]);
    } else if (!TERMINAL.has(batch.status)) {
      setText("results-note", "Results appear when the job ends.");
      setText("dead-note", "");
    }
    if (batch.cron && state.polls % RUNS_EVERY_POLLS === 0) await loadRuns(generation);
    state.polls += 1;
    if (TERMINAL.has(batch.status)) return; // final: nothing more will change
  } catch (err) {
    if (generation !== state.generation) return;
    setText("job-error", `Could not load the job: ${err.message}`);
    if (err.status === 404) return; // no such job in this workspace: nothing to wait for
  }
  setTimeout(() => generation === state.generation && poll(generation), POLL_MS);
}

async function runAction(action) {
  try {
    await action();
  } catch (err) {
    setText("job-error", err.message);
  }
}

/** Wire the page's buttons once at start-up. */
export function setupJob() {
  document.getElementById("job-cancel").addEventListener("click", () =>
    runAction(async () => {
      if (state.batch && (await confirmCancel(state.batch))) startJob(state.id);
    }),
  );
  document.getElementById("download-jsonl").addEventListener("click", () =>
    runAction(() => downloadResults(state.id, "jsonl")),
  );
  document.getElementById("download-csv").addEventListener("click", () =>
    runAction(() => downloadResults(state.id, "csv")),
  );
  document.getElementById("results-prev").addEventListener("click", () => {
    state.page = Math.max(0, state.page - 1);
    runAction(() => loadResults(state.generation));
  });
  document.getElementById("results-next").addEventListener("click", () => {
    state.page += 1;
    runAction(() => loadResults(state.generation));
  });
}

/** Show job id and keep it live until it ends or stopJob(). */
export function startJob(id) {
  state.generation += 1;
  Object.assign(state, { id, batch: null, page: 0, resultsFor: null, polls: 0 });
  setText("job-title", "Job");
  fill(document.getElementById("job-status"));
  for (const el of ["results-body", "dead-body", "job-runs", "job-details"]) {
    fill(document.getElementById(el));
  }
  document.getElementById("results-table").hidden = true;
  document.getElementById("dead-table").hidden = true;
  document.getElementById("results-prev").disabled = true;
  document.getElementById("results-next").disabled = true;
  setText("results-page", "");
  poll(state.generation);
}

/** Stop refreshing (the view is hidden). */
export function stopJob() {
  state.generation += 1;
}
