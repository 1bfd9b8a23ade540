"""A check of everything the panel shows, applied on every page a browser test visits.

What it catches: text that only a rendering bug produces (``[object …]``, a lone
``undefined`` or ``NaN``), in the page's text or in an attribute (a tooltip, a link, an
SVG coordinate), and an *empty value*: a value cell with no text. The value cells are the
panel's key/value and table cells: every ``<dd>`` (a detail's value), every ``<td>``
except an action cell (``td.actions``, which holds a button or nothing), every counter
(``.count``) and every SVG ``<text>``. A cell whose text is whitespace only is empty; the
panel shows a dash (``—``) for a value it does not have.

The scan runs after every change of the DOM (debounced to one per task) and reports each
new problem to the test through an exposed binding, so problems survive a reload; the
test's fixture fails on any, and scans once more before it closes the page.
"""

from __future__ import annotations

from playwright.async_api import BrowserContext, Page

MAX_PROBLEMS = 20

SCAN_SCRIPT = r"""
(() => {
  const BAD = /\[object|\bundefined\b|\bNaN\b/;
  const VALUE_CELLS = "dd, td:not(.actions), .count, svg text";
  function where(el) {
    const holder = el.closest("[id]");
    const context = (el.parentElement ?? el).outerHTML.replace(/\s+/g, " ").slice(0, 240);
    return `${location.hash || "#"} in #${holder ? holder.id : "?"}: ${context}`;
  }
  function scan() {
    const found = [];
    const body = document.body;
    if (!body) return found;
    const text = body.textContent;
    const bad = BAD.exec(text);
    if (bad) {
      const around = text.slice(Math.max(0, bad.index - 80), bad.index + 80).replace(/\s+/g, " ");
      found.push(`${location.hash || "#"} text: …${around}…`);
    }
    for (const el of body.querySelectorAll(VALUE_CELLS)) {
      if (!el.textContent.trim()) found.push(`empty <${el.tagName.toLowerCase()}> ${where(el)}`);
    }
    for (const el of body.querySelectorAll("*")) {
      for (const attr of el.attributes) {
        if (BAD.test(attr.value)) found.push(`attribute ${attr.name}="${attr.value}" ${where(el)}`);
      }
    }
    return found;
  }
  window.__panelScan = scan;
  const reported = new Set();
  let queued = false;
  function report() {
    queued = false;
    for (const problem of scan()) {
      if (reported.has(problem)) continue;
      reported.add(problem);
      window.__panelReport(problem);
    }
  }
  function later() {
    if (queued) return;
    queued = true;
    setTimeout(report, 0);
  }
  document.addEventListener("DOMContentLoaded", () => {
    new MutationObserver(later).observe(document.body, {
      subtree: true, childList: true, characterData: true, attributes: true,
    });
    later();
  });
})();
"""


async def watch_panel(context: BrowserContext, problems: list[str]) -> None:
    """Scan every page of ``context`` after each DOM change; append problems found."""

    def record(_source: object, problem: str) -> None:
        if len(problems) < MAX_PROBLEMS:
            problems.append(problem)

    await context.expose_binding("__panelReport", record)
    await context.add_init_script(SCAN_SCRIPT)


async def scan_now(page: Page) -> list[str]:
    """The problems on ``page`` right now."""
    return list(await page.evaluate("window.__panelScan ? window.__panelScan() : []"))
