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
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

/** Replace every child of el. */
export function fill(el, ...children) {
  el.replaceChildren();
  for (const child of children.flat()) if (child) el.append(child);
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

export const CANCELABLE = new Set(["queued", "running", "paused", "scheduled"]);
export const PAUSABLE = new Set(["queued", "running"]);
export const TERMINAL = new Set(["completed", "failed", "canceled", "expired"]);

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
