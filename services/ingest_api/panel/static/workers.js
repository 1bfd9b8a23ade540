// The Workers page: the live row-workers (what each holds: this workspace's jobs by name,
// other rows as a count, against its concurrency), the queue depths and the deployments
// throttled lately, from GET /v1/workers, refreshed every 2 s while shown.

import { api } from "./api.js";
import { fill, h, setText } from "./dom.js";

const POLL_MS = 2000;
const state = { generation: 0 };

function workerRow(w) {
  const held = w.jobs.length
    ? h("ul", { class: "metadata" }, w.jobs.map((j) =>
        h("li", {}, h("a", { href: `#/jobs/${j.id}` }, j.name), ` ${j.rows} rows`)))
    : h("span", { class: "muted" }, "none of yours");
  const busy = w.concurrency ? `${w.rows_held} / ${w.concurrency}` : String(w.rows_held);
  return h(
    "tr",
    { dataset: { worker: w.worker } },
    h("td", {}, h("code", {}, w.worker)),
    h("td", { class: "num" }, busy),
    h("td", {}, held),
    h("td", { class: "num" }, String(w.other_rows)),
    h("td", { class: "num" }, `${w.seconds_ago.toFixed(1)} s ago`),
  );
}

function render(fleet) {
  setText("workers-summary",
    `${fleet.workers.length} row-worker${fleet.workers.length === 1 ? "" : "s"} live`);
  fill(document.getElementById("workers-body"), fleet.workers.map(workerRow));
  document.getElementById("workers-table").hidden = fleet.workers.length === 0;
  fill(
    document.getElementById("queues-body"),
    fleet.queues.map((q) => h("tr", { dataset: { queue: q.queue } },
      h("td", {}, q.queue),
      h("td", { class: q.ready ? "num busy" : "num" }, q.ready.toLocaleString("en")),
      h("td", { class: "num" }, String(q.consumers)))),
  );
  fill(
    document.getElementById("throttled-list"),
    fleet.throttled.length
      ? fleet.throttled.map((t) => h("li", { dataset: { deployment: t.deployment } },
          h("code", {}, t.deployment), ` answered 429 ${t.seconds_ago.toFixed(0)} s ago`,
          t.retry_after_s === null ? "" : ` (Retry-After ${t.retry_after_s} s)`))
      : h("li", { class: "muted" }, "No deployment throttled in the last minute."),
  );
}

async function poll(generation) {
  try {
    const fleet = await api.workers();
    if (generation !== state.generation) return;
    setText("workers-error", "");
    render(fleet);
  } catch (err) {
    if (generation !== state.generation) return;
    setText("workers-error", `Could not load the workers: ${err.message}`);
  }
  setTimeout(() => generation === state.generation && poll(generation), POLL_MS);
}

/** Show the page and keep it live until stopWorkers(). */
export function startWorkers() {
  state.generation += 1;
  poll(state.generation);
}

/** Stop refreshing (the view is hidden). */
export function stopWorkers() {
  state.generation += 1;
}
