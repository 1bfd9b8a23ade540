// The usage page: the workspace's rows, tokens and cost per UTC day and per model over a
// range of days (GET /v1/usage, summed in the ledger from each job's counters), with the
// range's totals, a cost bar per day and the sums per model.

import { api } from "./api.js";
import { fill, h, money, setText } from "./dom.js";

const DEFAULT_DAYS = 30;
const state = { generation: 0 };

function day(offset) {
  const d = new Date();
  d.setUTCDate(d.getUTCDate() + offset);
  return d.toISOString().slice(0, 10);
}

function n(value) {
  return value.toLocaleString("en");
}

function sum(lines, key) {
  return lines.reduce((total, line) => total + line[key], 0);
}

/** The lines summed per model, most expensive first. */
function perModel(lines) {
  const models = new Map();
  for (const line of lines) {
    const m = models.get(line.model) ?? { model: line.model, jobs: 0, rows: 0, failed: 0,
      prompt_tokens: 0, completion_tokens: 0, cost_usd: 0 };
    for (const key of ["jobs", "rows", "failed", "prompt_tokens", "completion_tokens", "cost_usd"]) {
      m[key] += line[key];
    }
    models.set(line.model, m);
  }
  return [...models.values()].sort((a, b) => b.cost_usd - a.cost_usd || a.model.localeCompare(b.model));
}

function cells(line) {
  return [
    h("td", { class: "num" }, n(line.jobs)),
    h("td", { class: "num" }, n(line.rows)),
    h("td", { class: line.failed ? "num error-text" : "num" }, n(line.failed)),
    h("td", { class: "num" }, n(line.prompt_tokens)),
    h("td", { class: "num" }, n(line.completion_tokens)),
    h("td", { class: "num" }, money(line.cost_usd)),
  ];
}

function costBar(cost, top) {
  const bar = h("span", { class: "cost-bar", title: money(cost) });
  bar.style.width = top ? `${(100 * cost) / top}%` : "0%";
  return h("span", { class: "cost-bar-box" }, bar, h("span", { class: "visually-hidden" }, money(cost)));
}

function render(usage) {
  const lines = usage.data;
  setText("usage-range", `${usage.from} to ${usage.to} (UTC)`);
  setText("usage-rows", n(sum(lines, "rows")));
  setText("usage-failed", n(sum(lines, "failed")));
  setText("usage-tokens", n(sum(lines, "prompt_tokens") + sum(lines, "completion_tokens")));
  setText("usage-cost", money(sum(lines, "cost_usd")));
  document.getElementById("usage-empty").hidden = lines.length > 0;
  document.getElementById("usage-tables").hidden = lines.length === 0;
  const days = new Map();
  for (const line of lines) days.set(line.day, (days.get(line.day) ?? 0) + line.cost_usd);
  const top = Math.max(0, ...days.values());
  fill(
    document.getElementById("usage-days-body"),
    lines.map((line) =>
      h("tr", { dataset: { day: line.day, model: line.model } },
        h("td", {}, h("time", { datetime: line.day }, line.day)),
        h("td", {}, line.model),
        cells(line),
        h("td", { class: "bar-cell" }, costBar(line.cost_usd, top)))),
  );
  fill(
    document.getElementById("usage-models-body"),
    perModel(lines).map((m) => h("tr", { dataset: { model: m.model } }, h("td", {}, m.model), cells(m))),
  );
}

async function load() {
  const generation = ++state.generation;
  setText("usage-error", "");
  try {
    const usage = await api.usage(document.getElementById("usage-from").value,
      document.getElementById("usage-to").value);
    if (generation === state.generation) render(usage);
  } catch (err) {
    if (generation === state.generation) setText("usage-error", `Could not load usage: ${err.message}`);
  }
}

/** Show the page: the last 30 days unless a range was chosen. */
export function startUsage() {
  const from = document.getElementById("usage-from");
  const to = document.getElementById("usage-to");
  if (!to.value) to.value = day(0);
  if (!from.value) from.value = day(1 - DEFAULT_DAYS);
  load();
}

/** Wire the range form once. */
export function setupUsage() {
  document.getElementById("usage-form").addEventListener("submit", (event) => {
    event.preventDefault();
    load();
  });
}
