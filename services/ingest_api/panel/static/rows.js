// The job page's row tables: results (a page of RESULTS_PAGE rows read from the ndjson
// stream: the rows finished so far while the job runs, every row once it ended) and dead
// letters (the first DEAD_LETTERS_SHOWN), each optionally with the rows' details (tokens,
// attempts, deployment, latency, finish reason, cost). No cell is ever left empty.

import { api, streamResults } from "./api.js";
import { dash, fill, h, millis, money, setText } from "./dom.js";

export const RESULTS_PAGE = 25;
const DEAD_LETTERS_SHOWN = 100;

const RESULT_HEADS = [["#", "num"], ["custom_id"], ["Content or error"]];
const DEAD_HEADS = [["custom_id"], ["Error"], ["Attempts", "num"]];
const DETAIL_HEADS = [["Tokens (in / out)", "num"], ["Attempts", "num"], ["Deployment"],
  ["Latency", "num"], ["Finish"], ["Cost", "num"]];
const DEAD_DETAIL_HEADS = [["Tokens (in / out)", "num"], ["Deployment"], ["Latency", "num"],
  ["Cost", "num"]];

function cell(value, attrs = {}) {
  const empty = value === null || value === undefined || value === "";
  return h("td", attrs, empty ? dash() : value);
}

function tokens(row) {
  const usage = row.usage ?? {};
  return `${usage.prompt_tokens ?? 0} / ${usage.completion_tokens ?? 0}`;
}

function cost(row) {
  return row.cost_usd === undefined ? null : money(row.cost_usd);
}

function latency(row) {
  return row.latency_ms === null || row.latency_ms === undefined ? null : millis(row.latency_ms);
}

/** The detail cells of a result row (the order of DETAIL_HEADS). */
function detailCells(row) {
  return [
    cell(tokens(row), { class: "num" }),
    cell(String(row.attempts ?? ""), { class: "num" }),
    cell(row.deployment, { "data-col": "deployment" }),
    cell(latency(row), { class: "num" }),
    cell(row.finish_reason),
    cell(cost(row), { class: "num" }),
  ];
}

function deadDetailCells(row) {
  return [
    cell(tokens(row), { class: "num" }),
    cell(row.deployment, { "data-col": "deployment" }),
    cell(latency(row), { class: "num" }),
    cell(cost(row), { class: "num" }),
  ];
}

function resultCell(row) {
  if (row.error !== undefined && row.error !== null) {
    return h("td", { class: "error-text" }, row.error);
  }
  if (row.response !== undefined) {
    // Another endpoint than chat: the provider's body, shown as its JSON text.
    return h("td", { class: "json" }, JSON.stringify(row.response).slice(0, 2000));
  }
  if (!row.content) return h("td", { class: "muted" }, row.tool_calls ? "(tool calls)" : "(empty)");
  return h("td", {}, row.content);
}

function heads(id, names) {
  fill(document.getElementById(id), names.map(([name, kind]) => h("th", { scope: "col", class: kind }, name)));
}

function resultsNote(any, partial, failedOnly) {
  if (!any && failedOnly) return partial ? "No row has failed so far." : "No failed rows.";
  if (!any) return partial ? "No rows have finished yet." : "No results.";
  return partial ? "Rows finished so far; the job has not ended yet." : "";
}

/** Read one page of results; fill the table, the pager and the note. */
export async function loadResults(view, isCurrent) {
  const first = view.page * RESULTS_PAGE;
  const rows = [];
  let more = false;
  await streamResults(
    view.id,
    (row, index) => {
      if (index < first) return true;
      if (rows.length === RESULTS_PAGE) {
        more = true;
        return false;
      }
      rows.push([index, row]);
      return true;
    },
    { partial: view.partial, details: view.details, failedOnly: view.failedOnly },
  );
  if (!isCurrent()) return;
  heads("results-heads", view.details ? [...RESULT_HEADS, ...DETAIL_HEADS] : RESULT_HEADS);
  fill(
    document.getElementById("results-body"),
    rows.map(([i, row]) =>
      h(
        "tr",
        {},
        h("td", { class: "num" }, String(i + 1)),
        cell(row.custom_id),
        resultCell(row),
        view.details ? detailCells(row) : [],
      ),
    ),
  );
  document.getElementById("results-table").hidden = rows.length === 0;
  setText("results-note", resultsNote(rows.length > 0, view.partial, view.failedOnly));
  setText("results-page", rows.length ? `Rows ${first + 1}–${first + rows.length}` : "");
  document.getElementById("results-prev").disabled = view.page === 0;
  document.getElementById("results-next").disabled = !more;
}

/** The job's dead letters (the first DEAD_LETTERS_SHOWN). */
export async function loadDeadLetters(view, isCurrent) {
  const { data } = await api.deadLetters(view.id, view.details);
  if (!isCurrent()) return;
  const shown = data.slice(0, DEAD_LETTERS_SHOWN);
  heads("dead-heads", view.details ? [...DEAD_HEADS, ...DEAD_DETAIL_HEADS] : DEAD_HEADS);
  fill(
    document.getElementById("dead-body"),
    shown.map((r) =>
      h(
        "tr",
        {},
        cell(r.custom_id),
        h("td", { class: "error-text" }, r.error || "—"),
        h("td", { class: "num" }, String(r.attempts)),
        view.details ? deadDetailCells(r) : [],
      ),
    ),
  );
  document.getElementById("dead-table").hidden = shown.length === 0;
  const more = data.length > shown.length ? ` (showing the first ${shown.length} of ${data.length})` : "";
  setText("dead-note", data.length ? more : "No dead letters.");
}

/** Empty both tables (another job is shown). */
export function clearRows() {
  fill(document.getElementById("results-body"));
  fill(document.getElementById("dead-body"));
  document.getElementById("results-table").hidden = true;
  document.getElementById("dead-table").hidden = true;
  document.getElementById("results-prev").disabled = true;
  document.getElementById("results-next").disabled = true;
  setText("results-page", "");
}
