// The job page's webhook delivery log: every attempt of the completion webhook (oldest
// first, at most one page of 100) and a Redeliver button, which asks the notifier to POST
// the completion summary again; the log is then re-read until the delivery settles.

import { api } from "./api.js";
import { DELIVERY_SETTLED, dash, fill, h, millis, setText, statusBadge, timeEl } from "./dom.js";

const PAGE = 100;

function cell(value, attrs = {}) {
  const empty = value === null || value === undefined || value === "";
  return h("td", attrs, empty ? dash() : value);
}

function attemptRow(attempt) {
  return h(
    "tr",
    { dataset: { attempt: String(attempt.attempt) } },
    h("td", { class: "num" }, String(attempt.attempt)),
    h("td", {}, statusBadge(attempt.status)),
    cell(attempt.response_status === null ? null : String(attempt.response_status), { class: "num" }),
    cell(attempt.duration_ms === null ? null : millis(attempt.duration_ms), { class: "num" }),
    h("td", {}, timeEl(attempt.attempted_at)),
    cell(attempt.error, { class: "error-text" }),
    h("td", {}, attempt.redelivery ? "yes" : "no"),
  );
}

/**
 * Read and show the delivery log of job id; resolve to true when nothing more will change
 * on its own (no delivery, or one that settled).
 */
export async function loadDeliveries(id, isCurrent) {
  const log = await api.deliveries(id, PAGE);
  if (!isCurrent()) return true;
  const rows = log.data.map(attemptRow);
  fill(document.getElementById("deliveries-body"), rows);
  document.getElementById("deliveries-table").hidden = rows.length === 0;
  const state = document.getElementById("delivery-state");
  if (log.status === null) {
    fill(state, "No webhook delivery for this job.");
  } else {
    const next = log.next_attempt_at ? [" · next attempt ", timeEl(log.next_attempt_at)] : [];
    fill(state, "Delivery ", statusBadge(log.status), next,
      log.has_more ? ` · showing the first ${log.data.length} attempts` : "");
  }
  const settled = log.status === null || DELIVERY_SETTLED.has(log.status);
  const redeliver = document.getElementById("redeliver");
  redeliver.hidden = log.status === null;
  redeliver.disabled = !settled;
  return settled;
}

/** Ask for a redelivery; show what the API said. */
export async function redeliver(id) {
  const scheduled = await api.redeliver(id);
  setText("delivery-note", `Redelivery scheduled (${scheduled.status}).`);
}

/** Empty the log (another job is shown). */
export function clearDeliveries() {
  fill(document.getElementById("deliveries-body"));
  fill(document.getElementById("delivery-state"));
  setText("delivery-note", "");
  document.getElementById("deliveries-table").hidden = true;
  document.getElementById("redeliver").hidden = true;
}
