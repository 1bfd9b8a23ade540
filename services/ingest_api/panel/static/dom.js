// Small DOM and formatting helpers. Text always goes in through textContent, never HTML.

/** Create an element: h("a", {href: "#"}, "text", child). */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "dataset") Object.assign(el.dataset, value);
    else if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
    else el.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

/** Replace every child of el; children may be nested arrays of nodes and strings. */
export function fill(el, ...children) {
  el.replaceChildren();
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false || child === "") continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

/** A muted dash: the value of a cell or detail that has none. */
export function dash() {
  return h("span", { class: "muted" }, "—");
}

/** "$12.34", or three significant digits below a dollar ("$0.000123"), or a dash. */
export function money(usd) {
  if (usd === null || usd === undefined) return "—";
  if (usd === 0) return "$0.00";
  const digits = Math.abs(usd) >= 1 ? 2 : Math.min(9, 2 - Math.floor(Math.log10(Math.abs(usd))));
  return `$${usd.toFixed(digits)}`;
}

/** "1:05:09", "4:07" or "0:09" for seconds, or a dash. */
export function clock(seconds) {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) return "—";
  const whole = Math.round(seconds);
  const hours = Math.floor(whole / 3600);
  const minutes = Math.floor((whole % 3600) / 60);
  const secs = String(whole % 60).padStart(2, "0");
  return hours ? `${hours}:${String(minutes).padStart(2, "0")}:${secs}` : `${minutes}:${secs}`;
}

/** "1,250 ms" / "3.2 s" for milliseconds, or a dash. */
export function millis(ms) {
  if (ms === null || ms === undefined) return "—";
  return ms < 10_000 ? `${ms.toLocaleString("en")} ms` : `${(ms / 1000).toFixed(1)} s`;
}

/** Set the text of the element with this id. */
export function setText(id, text) {
  document.getElementById(id).textContent = text ?? "";
}

/** "2026-10-04T09:12:44Z" as a <time> reading "2026-10-04 09:12:44", or a dash. */
export function timeEl(iso) {
  if (!iso) return h("span", { class: "muted" }, "—");
  return h("time", { datetime: iso, title: iso }, iso.replace("T", " ").replace("Z", ""));
}

/** Rows with an outcome, in percent of total (0–100, floored; 100 only when done). */
export function percent(batch) {
  if (!batch.total) return 0;
  return Math.floor((100 * (batch.completed + batch.failed)) / batch.total);
}

/** "3 / 10 (30%)" */
export function progressText(batch) {
  return `${batch.completed + batch.failed} / ${batch.total} (${percent(batch)}%)`;
}

/** A status badge. */
export function statusBadge(status) {
  return h("span", { class: `status status-${status}`, "data-status": status }, status);
}

/** "8 failed" for a job with failed rows ("8 rows failed" when the job itself failed), or
 * null: what follows the status wherever a job is shown. */
export function failedText(batch) {
  if (!batch.failed) return null;
  return batch.status === "failed" ? `${batch.failed} rows failed` : `${batch.failed} failed`;
}

/** A job's status badge: "completed · 8 failed" in the colour of failure when rows failed
 * (class status-with-failures), the plain status badge otherwise. */
export function jobBadge(batch) {
  const failed = failedText(batch);
  if (!failed) return statusBadge(batch.status);
  return h(
    "span",
    {
      class: `status status-${batch.status} status-with-failures`,
      "data-status": batch.status,
      "data-failed": String(batch.failed),
    },
    `${batch.status} · ${failed}`,
  );
}

/** The three parts of a job's finished rows: completed, failed (not dead-lettered) and
 * dead letter (failed for a transient cause, after every attempt). */
export function segments(batch) {
  const dead = batch.dead_letter ?? 0;
  return [
    ["completed", batch.completed],
    ["failed", Math.max(0, batch.failed - dead)],
    ["dead-letter", dead],
  ];
}

/** A progress bar in segments (completed green, failed red, dead letter dark red), each
 * segment's width its share of the rows, with its count in data-count and a tooltip. */
export function progressBar(batch, label) {
  const total = batch.total || 0;
  const parts = segments(batch).map(([name, count]) => {
    const seg = h("span", {
      class: `seg seg-${name}`,
      dataset: { count: String(count) },
      title: `${count} ${name.replace("-", " ")}`,
    });
    seg.style.width = total ? `${(100 * count) / total}%` : "0%";
    return seg;
  });
  const text = segments(batch)
    .map(([name, count]) => `${count} ${name.replace("-", " ")}`)
    .join(", ");
  return h(
    "div",
    {
      class: "segbar",
      role: "progressbar",
      "aria-label": label,
      "aria-valuemin": "0",
      "aria-valuemax": "100",
      "aria-valuenow": String(percent(batch)),
      "aria-valuetext": `${percent(batch)}%: ${text} of ${total}`,
    },
    parts,
  );
}

export const CANCELABLE = new Set(["queued", "running", "paused", "scheduled"]);
export const PAUSABLE = new Set(["queued", "running"]);
export const TERMINAL = new Set(["completed", "failed", "canceled", "expired"]);
export const DELIVERY_SETTLED = new Set(["delivered", "refused", "failed"]);

/** Keep keyboard focus across a re-render: remember the focused element's key. */
export function focusKey() {
  return document.activeElement?.dataset?.focusKey ?? null;
}

/** Put focus back on the element that carries key, if it still exists. */
export function restoreFocus(key) {
  if (!key) return;
  const el = document.querySelector(`[data-focus-key="${CSS.escape(key)}"]`);
  if (el) el.focus();
}
