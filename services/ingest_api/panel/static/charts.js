// The job page's two pictures, as inline SVG built with DOM calls (text only through
// textContent): rows finished per interval over time (completed below, failed stacked on
// top in red) and a histogram of per-row latency over the API's fixed buckets (failed
// rows stacked in red likewise). Both are
// drawn from GET /v1/batches/{id}/stats, so their size is bounded whatever the job's.

import { h, millis } from "./dom.js";

const SVG = "http://www.w3.org/2000/svg";
const WIDTH = 640;
const HEIGHT = 220;
const PAD = { left: 44, right: 12, top: 12, bottom: 36 };
const MAX_BAR = 48; // a bar never wider than this, however few the intervals

function rows(n) {
  return `${n} row${n === 1 ? "" : "s"}`;
}

function s(tag, attrs = {}, text = null) {
  const el = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs)) el.setAttribute(name, String(value));
  if (text !== null) el.textContent = text;
  return el;
}

function frame(label) {
  return s("svg", {
    viewBox: `0 0 ${WIDTH} ${HEIGHT}`,
    role: "img",
    "aria-label": label,
    class: "chart",
    preserveAspectRatio: "xMidYMid meet",
  });
}

function plotWidth() {
  return WIDTH - PAD.left - PAD.right;
}

function plotHeight() {
  return HEIGHT - PAD.top - PAD.bottom;
}

/** The y axis: a base line, and the top value written beside it. */
function yAxis(svg, top) {
  const y0 = PAD.top + plotHeight();
  svg.append(
    s("line", { x1: PAD.left, y1: y0, x2: WIDTH - PAD.right, y2: y0, class: "axis" }),
    s("line", { x1: PAD.left, y1: PAD.top, x2: PAD.left, y2: y0, class: "axis" }),
    s("text", { x: PAD.left - 6, y: PAD.top + 4, "text-anchor": "end", class: "tick" }, String(top)),
    s("text", { x: PAD.left - 6, y: y0, "text-anchor": "end", class: "tick" }, "0"),
  );
}

function hhmmss(iso) {
  return iso.slice(11, 19);
}

/**
 * Rows finished per interval: one bar per interval, completed (green) with failed (red)
 * stacked on top; each bar carries data-completed/data-failed and a <title> tooltip.
 */
export function progressChart(stats) {
  const points = stats.progress;
  const top = Math.max(1, ...points.map((p) => p.completed + p.failed));
  const done = points.reduce((n, p) => n + p.completed + p.failed, 0);
  const svg = frame(
    `Rows finished per ${stats.interval_s} s interval: ${rows(done)} over ${points.length} intervals`,
  );
  yAxis(svg, top);
  const step = plotWidth() / points.length;
  const barWidth = Math.min(MAX_BAR, Math.max(1, step * 0.8));
  const scale = plotHeight() / top;
  const y0 = PAD.top + plotHeight();
  points.forEach((point, i) => {
    const x = PAD.left + i * step + (step - barWidth) / 2;
    const okHeight = point.completed * scale;
    const failHeight = point.failed * scale;
    const bar = s("g", {
      class: "bar",
      "data-start": point.start,
      "data-completed": point.completed,
      "data-failed": point.failed,
    });
    bar.append(
      s("title", {}, `${hhmmss(point.start)} UTC: ${point.completed} completed, ${point.failed} failed`),
      s("rect", { x, y: y0 - okHeight, width: barWidth, height: okHeight, class: "ok" }),
      s("rect", { x, y: y0 - okHeight - failHeight, width: barWidth, height: failHeight, class: "fail" }),
    );
    svg.append(bar);
  });
  const first = points[0].start;
  const last = points[points.length - 1].start;
  svg.append(
    s("text", { x: PAD.left, y: HEIGHT - 14, class: "tick" }, `${hhmmss(first)} UTC`),
    s("text", { x: WIDTH - PAD.right, y: HEIGHT - 14, "text-anchor": "end", class: "tick" }, hhmmss(last)),
    s("text", { x: WIDTH / 2, y: HEIGHT - 2, "text-anchor": "middle", class: "tick" },
      `rows per ${stats.interval_s} s`),
  );
  return svg;
}

/** "10ms", "250ms", "1s", "2.5s": short enough to sit under a bar. */
function shortMs(ms) {
  return ms < 1000 ? `${ms}ms` : `${ms / 1000}s`;
}

function bucketLabel(bucket, previous) {
  return bucket.le_ms === null ? `>${shortMs(previous)}` : `≤${shortMs(bucket.le_ms)}`;
}

/** Per-row latency: one bar per fixed bucket, succeeded rows (green) with failed ones (red)
 * stacked on top, each with data-le-ms/data-count/data-failed and a tooltip. */
export function latencyChart(latency) {
  const buckets = latency.buckets;
  const top = Math.max(1, ...buckets.map((b) => b.count));
  const svg = frame(`Latency of ${rows(latency.count)}, p50 ${millis(latency.p50_ms)}`);
  yAxis(svg, top);
  const step = plotWidth() / buckets.length;
  const barWidth = step * 0.8;
  const scale = plotHeight() / top;
  const y0 = PAD.top + plotHeight();
  buckets.forEach((bucket, i) => {
    const label = bucketLabel(bucket, i ? buckets[i - 1].le_ms : 0);
    const x = PAD.left + i * step + (step - barWidth) / 2;
    const failed = bucket.failed ?? 0;
    const okHeight = (bucket.count - failed) * scale;
    const failHeight = failed * scale;
    const bar = s("g", {
      class: "bar",
      "data-le-ms": bucket.le_ms === null ? "inf" : bucket.le_ms,
      "data-count": bucket.count,
      "data-failed": failed,
    });
    bar.append(
      s("title", {}, `${label}: ${rows(bucket.count)}, ${failed} failed`),
      s("rect", { x, y: y0 - okHeight, width: barWidth, height: okHeight, class: "ok" }),
      s("rect", { x, y: y0 - okHeight - failHeight, width: barWidth, height: failHeight, class: "fail" }),
      s("text", { x: x + barWidth / 2, y: y0 + 14, "text-anchor": "middle", class: "tick small" }, label),
    );
    svg.append(bar);
  });
  return svg;
}

/** "120 rows · p50 40 ms · p90 80 ms · p99 120 ms · max 130 ms" */
export function latencySummary(latency) {
  return h(
    "p",
    { class: "chart-summary" },
    `${rows(latency.count)} · p50 ${millis(latency.p50_ms)} · p90 ${millis(latency.p90_ms)}` +
      ` · p99 ${millis(latency.p99_ms)} · max ${millis(latency.max_ms)}`,
  );
}
