// The job page: counters, progress, cost, rate and ETA (live until the job ends), details,
// usage, the Pause / Resume / Retry failed rows / Cancel / Delete buttons, two charts from the
// job's stats, results (the rows finished so far while it runs; optionally with every
// row's details), dead letters, the webhook delivery log, downloads, and for a cron
// template its next run and its runs.

import { api } from "./api.js";
import { confirmCancel } from "./cancel.js";
import { confirmDelete } from "./delete.js";
import { latencyChart, latencySummary, progressChart } from "./charts.js";
import { clearDeliveries, loadDeliveries, redeliver } from "./deliveries.js";
import { downloadResults } from "./export.js";
import {
  CANCELABLE,
  PAUSABLE,
  TERMINAL,
  clock,
  fill,
  h,
  jobBadge,
  money,
  progressBar,
  progressText,
  setText,
  timeEl,
} from "./dom.js";
import { clearRows, loadDeadLetters, loadResults } from "./rows.js";
import { clearTimeline, loadTimeline } from "./timeline.js";

const POLL_MS = 1000;
const LIVE_EVERY_POLLS = 5; // partial results and stats of a live job: every 5 s
const DELIVERY_POLL_MS = 2000;
const DELIVERY_POLLS = 60; // follow a delivery for at most 2 minutes
const DELIVERY_FIRST_POLLS = 5; // a job that just ended may not have its delivery yet
const RUN_SCAN_PAGES = 5; // runs are found among the newest 500 jobs of the workspace
const RUNS_EVERY_POLLS = 10;

const state = {
  id: null,
  batch: null,
  generation: 0,
  page: 0,
  details: false,
  failedOnly: false,
  resultsFor: null,
  polls: 0,
  deliveryPolls: 0,
};

function current(generation) {
  return () => generation === state.generation;
}

function detail(term, value) {
  return [h("dt", {}, term), h("dd", {}, value)];
}

function jobLink(id) {
  return h("a", { href: `#/jobs/${id}` }, h("code", {}, id));
}

function rate(perSecond) {
  if (perSecond === null || perSecond === undefined) return "—";
  return perSecond < 10 ? perSecond.toFixed(1) : String(Math.round(perSecond));
}

function renderButtons(batch) {
  document.getElementById("job-cancel").hidden = !CANCELABLE.has(batch.status);
  document.getElementById("job-pause").hidden = !PAUSABLE.has(batch.status);
  document.getElementById("job-resume").hidden = batch.status !== "paused";
  document.getElementById("job-retry").hidden = !(TERMINAL.has(batch.status) && batch.failed > 0);
  // An ended job, or a cron template (scheduled or not): what DELETE /v1/batches/{id} takes.
  document.getElementById("job-delete").hidden = !(TERMINAL.has(batch.status) || batch.cron);
}

function renderCounters(batch) {
  setText("count-total", batch.total);
  setText("count-completed", batch.completed);
  setText("count-failed", batch.failed);
  setText("count-dead", batch.dead_letter);
  document.getElementById("failed-item").classList.toggle("alarm", batch.failed > 0);
  document.getElementById("dead-item").classList.toggle("alarm", batch.dead_letter > 0);
  setText("count-cost", money(batch.cost_usd ?? 0));
  setText("cost-label", batch.budget_usd ? `cost of ${money(batch.budget_usd)} budget` : "cost");
  const running = batch.status === "running";
  document.getElementById("rate-item").hidden = !running;
  document.getElementById("eta-item").hidden = !running;
  setText("count-rate", rate(batch.rows_per_s));
  setText("count-eta", clock(batch.eta_s));
}

function renderBatch(batch) {
  setText("job-title", batch.name);
  fill(document.getElementById("job-status"), jobBadge(batch));
  renderButtons(batch);
  fill(document.getElementById("job-progress"), progressBar(batch, "Progress"));
  setText("job-progress-label", progressText(batch));
  renderCounters(batch);
  const template = batch.template_id
    ? h("a", { href: `#/jobs/${batch.template_id}` }, batch.template_id)
    : null;
  const retries = batch.retries ?? [];
  fill(
    document.getElementById("job-details"),
    detail("ID", h("code", {}, batch.id)),
    detail("Model", batch.model),
    detail("Priority", String(batch.priority)),
    detail("Created", timeEl(batch.created_at)),
    detail("Started", timeEl(batch.started_at)),
    detail("Finished", timeEl(batch.completed_at)),
    batch.expires_at ? detail("Expires", timeEl(batch.expires_at)) : [],
    batch.budget_usd ? detail("Budget", money(batch.budget_usd)) : [],
    savingDetail(batch.saving),
    lanesDetail(batch.lanes),
    planDetail(batch.plan),
    batch.error ? detail("Error", batch.error) : [],
    batch.cron ? detail("Cron", h("code", {}, batch.cron)) : [],
    batch.cron ? detail("Next run", timeEl(batch.next_run_at)) : [],
    template ? detail("Template", template) : [],
    batch.retry_of ? detail("Retry of", jobLink(batch.retry_of)) : [],
    retries.length
      ? detail("Retries", h("ul", { class: "metadata" }, retries.map((id) => h("li", {}, jobLink(id)))))
      : [],
    batch.params && Object.keys(batch.params).length
      ? detail("Parameters", h("code", { class: "params" }, paramsText(batch.params)))
      : [],
    batch.metadata ? detail("Metadata", metadataList(batch.metadata)) : [],
  );
  renderUsage(batch.usage);
  const terminal = TERMINAL.has(batch.status);
  document.getElementById("download-jsonl").disabled = !terminal;
  document.getElementById("download-csv").disabled = !terminal;
  document.getElementById("runs-section").hidden = !batch.cron;
  document.getElementById("charts-section").hidden = Boolean(batch.cron);
  document.getElementById("deliveries-section").hidden = !terminal;
}

/** The rows each lane answered and what they cost (only the lanes that answered any). */
function lanesDetail(lanes) {
  const used = Object.entries(lanes ?? {}).filter(([, spent]) => spent.rows > 0);
  if (used.length === 0) return [];
  return detail(
    "Cost per lane",
    h("ul", { class: "lanes" },
      used.map(([lane, spent]) => h("li", { "data-lane": lane },
        `${lane}: ${spent.rows} rows, ${money(spent.cost_usd)}`))),
  );
}

/** The plan chosen when the job was claimed: each lane's rows, then its expected cost. */
function planDetail(plan) {
  if (!plan) return [];
  const steps = plan.steps.map((step) => `${step.lane} ${step.rows} rows (${step.deployment})`);
  return detail("Plan", `${steps.join(" + ") || "nothing"}; expected ${money(plan.cost_usd)}`);
}

/** What the job saved against all-realtime, when any answered row had a realtime price. */
function savingDetail(saving) {
  if (!saving || !(saving.all_realtime_usd > 0)) return [];
  const share = Math.round((saving.saved_fraction ?? 0) * 100);
  return detail(
    "Saved",
    `${money(saving.saved_usd)} (${share}%) against ${money(saving.all_realtime_usd)} all-realtime`,
  );
}

/** {"temperature": 0.2, "max_tokens": 64}, one key after another. */
function paramsText(params) {
  return Object.entries(params).map(([k, v]) => `"${k}": ${JSON.stringify(v)}`).join(", ");
}

function metadataList(metadata) {
  return h("ul", { class: "metadata" },
    Object.entries(metadata).map(([k, v]) => h("li", {}, h("code", {}, k), " ", String(v))));
}

function renderUsage(usage) {
  const section = document.getElementById("usage-section");
  const entries = usage && typeof usage === "object" ? Object.entries(usage) : [];
  section.hidden = entries.length === 0;
  fill(
    document.getElementById("job-usage"),
    entries.map(([k, v]) => detail(k.replaceAll("_", " "), String(v))),
  );
}

/** Draw both charts; a failure shows in the chart area and never stops the page. */
async function loadStats(generation) {
  let stats;
  try {
    stats = await api.stats(state.id);
  } catch (err) {
    if (current(generation)()) {
      fill(document.getElementById("chart-progress"),
        h("p", { class: "error-text" }, `Could not load the charts: ${err.message}`));
    }
    return;
  }
  if (!current(generation)()) return;
  const progress = document.getElementById("chart-progress");
  if (stats.progress.length) fill(progress, progressChart(stats));
  else fill(progress, h("p", { class: "empty" }, "No rows have finished yet."));
  const latency = document.getElementById("chart-latency");
  if (stats.latency.count) fill(latency, latencyChart(stats.latency), latencySummary(stats.latency));
  else fill(latency, h("p", { class: "empty" }, "No row latency recorded yet."));
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
          jobBadge(r), " ", timeEl(r.created_at)))
      : h("li", { class: "muted" }, "No runs yet."),
  );
}

function rowsView(partial) {
  return {
    id: state.id, page: state.page, details: state.details, failedOnly: state.failedOnly, partial,
  };
}

/** Results and dead letters: the rows so far while live, every row once it ended. */
async function loadRows(generation) {
  const batch = state.batch;
  if (!batch) return;
  const terminal = TERMINAL.has(batch.status);
  const loads = [loadResults(rowsView(!terminal), current(generation))];
  if (terminal) loads.push(loadDeadLetters(rowsView(false), current(generation)));
  await Promise.all(loads);
}

async function refreshLive(batch, generation) {
  const terminal = TERMINAL.has(batch.status);
  if (batch.cron && !terminal) {
    setText("results-note", "Results appear when the job ends.");
    return;
  }
  const stats = batch.cron ? [] : [loadStats(generation), timeline(generation)];
  if (terminal) {
    if (state.resultsFor === batch.status) return;
    state.resultsFor = batch.status;
    state.deliveryPolls = 0;
    await Promise.all([loadRows(generation), ...stats]);
    followDeliveries(generation);
  } else if (state.polls % LIVE_EVERY_POLLS === 0) {
    setText("dead-note", "Dead letters are listed when the job ends.");
    await Promise.all([loadRows(generation), ...stats]);
  }
}

async function poll(generation) {
  try {
    const batch = await api.get(state.id);
    if (generation !== state.generation) return;
    state.batch = batch;
    renderBatch(batch);
    setText("job-error", "");
    await refreshLive(batch, generation);
    if (batch.cron && state.polls % RUNS_EVERY_POLLS === 0) {
      await Promise.all([loadRuns(generation), timeline(generation)]);
    }
    state.polls += 1;
    if (TERMINAL.has(batch.status)) return; // final: nothing more will change
  } catch (err) {
    if (generation !== state.generation) return;
    setText("job-error", `Could not load the job: ${err.message}`);
    if (err.status === 404) return; // no such job in this workspace: nothing to wait for
  }
  setTimeout(() => generation === state.generation && poll(generation), POLL_MS);
}

/** The timeline; a failure shows in its place and never stops the page. */
async function timeline(generation) {
  try {
    await loadTimeline(state.id, current(generation));
  } catch (err) {
    if (current(generation)()) {
      fill(document.getElementById("job-timeline"),
        h("li", { class: "error-text" }, `Could not load the timeline: ${err.message}`));
    }
  }
}

/** Re-read the delivery log (and the timeline, which lists its attempts) every 2 s until
 * the delivery settles (bounded). */
async function followDeliveries(generation) {
  let settled = true;
  try {
    settled = await loadDeliveries(state.id, current(generation));
    await timeline(generation);
  } catch (err) {
    if (generation === state.generation) setText("delivery-note", err.message);
  }
  state.deliveryPolls += 1;
  const early = state.deliveryPolls < DELIVERY_FIRST_POLLS;
  const more = (!settled || early) && state.deliveryPolls < DELIVERY_POLLS;
  if (more && generation === state.generation) {
    setTimeout(() => generation === state.generation && followDeliveries(generation), DELIVERY_POLL_MS);
  }
}

async function runAction(action) {
  try {
    setText("job-error", "");
    await action();
  } catch (err) {
    setText("job-error", err.message);
  }
}

function showBatch(batch) {
  if (batch.id !== state.id) return;
  state.batch = batch;
  renderBatch(batch);
}

function wireControls() {
  const on = (id, action) =>
    document.getElementById(id).addEventListener("click", () => runAction(action));
  on("job-cancel", async () => {
    if (state.batch && (await confirmCancel(state.batch))) startJob(state.id);
  });
  on("job-delete", async () => {
    if (!state.batch || !(await confirmDelete(state.batch))) return;
    const name = state.batch.name;
    stopJob();
    window.dispatchEvent(new CustomEvent("relay:deleted", { detail: { name } }));
    location.hash = "#/jobs";
  });
  on("job-pause", async () => showBatch(await api.pause(state.id)));
  on("job-resume", async () => showBatch(await api.resume(state.id)));
  on("job-retry", async () => {
    const created = await api.retry(state.id, "failed");
    location.hash = `#/jobs/${created.id}`;
  });
  on("redeliver", async () => {
    await redeliver(state.id);
    state.deliveryPolls = 0;
    followDeliveries(state.generation);
  });
  on("download-jsonl", () => downloadResults(state.id, "jsonl"));
  on("download-csv", () => downloadResults(state.id, "csv"));
}

/** Wire the page's buttons once at start-up. */
export function setupJob() {
  wireControls();
  document.getElementById("results-prev").addEventListener("click", () => {
    state.page = Math.max(0, state.page - 1);
    runAction(() => loadRows(state.generation));
  });
  document.getElementById("results-next").addEventListener("click", () => {
    state.page += 1;
    runAction(() => loadRows(state.generation));
  });
  document.getElementById("results-details").addEventListener("change", (event) => {
    state.details = event.target.checked;
    runAction(() => loadRows(state.generation));
  });
  document.getElementById("results-failed").addEventListener("change", (event) => {
    state.failedOnly = event.target.checked;
    state.page = 0;
    runAction(() => loadRows(state.generation));
  });
}

/** Show job id and keep it live until it ends or stopJob(). */
export function startJob(id) {
  state.generation += 1;
  Object.assign(state, { id, batch: null, page: 0, resultsFor: null, polls: 0, deliveryPolls: 0 });
  setText("job-title", "Job");
  setText("results-note", "");
  setText("dead-note", "");
  fill(document.getElementById("job-status"));
  for (const el of ["job-runs", "job-details", "chart-progress", "chart-latency"]) {
    fill(document.getElementById(el));
  }
  for (const el of ["job-pause", "job-resume", "job-retry", "job-cancel", "job-delete"]) {
    document.getElementById(el).hidden = true;
  }
  clearRows();
  clearDeliveries();
  clearTimeline();
  poll(state.generation);
}

/** Stop refreshing (the view is hidden). */
export function stopJob() {
  state.generation += 1;
}
