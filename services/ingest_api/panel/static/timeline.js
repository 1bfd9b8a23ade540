// The job page's timeline: what happened to the job, dated, oldest first, from
// GET /v1/batches/{id}/timeline (created, started, each pause and resume, budget reached,
// finished, every webhook attempt).

import { api } from "./api.js";
import { fill, h, statusBadge, timeEl } from "./dom.js";

const LABELS = {
  created: "Created",
  started: "Started",
  paused: "Paused",
  resumed: "Resumed",
  budget_reached: "Budget reached",
  finished: "Finished",
  webhook_attempt: "Webhook attempt",
};

function what(event) {
  if (event.event === "finished") return [LABELS.finished, " ", statusBadge(event.status)];
  if (event.event !== "webhook_attempt") return LABELS[event.event] ?? event.event;
  const http = event.http_status === null ? "no answer" : `HTTP ${event.http_status}`;
  return [
    `${LABELS.webhook_attempt} ${event.attempt} `, statusBadge(event.status), ` ${http}`,
    event.error ? h("span", { class: "error-text" }, ` · ${event.error}`) : null,
  ];
}

/** Read and show job id's timeline. */
export async function loadTimeline(id, isCurrent) {
  const timeline = await api.timeline(id);
  if (!isCurrent()) return;
  fill(
    document.getElementById("job-timeline"),
    timeline.data.map((event) =>
      h("li", { dataset: { event: event.event } }, timeEl(event.at), " ", h("span", {}, what(event)))),
    timeline.has_more ? h("li", { class: "muted" }, "…more events than shown") : null,
  );
}

/** Empty it (another job is shown). */
export function clearTimeline() {
  fill(document.getElementById("job-timeline"));
}
