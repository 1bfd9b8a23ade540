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

Also the small helpers of the job page's tests: rows, the job page, the batch through
the API with a workspace's key.
"""

from __future__ import annotations

from typing import Any

from playwright.async_api import BrowserContext, Locator, Page, expect

from tests.helpers.support import ApiClient, wait_until

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


def slow_rows(n: int, delay_ms: int, tag: str = "slow") -> list[dict[str, object]]:
    """``n`` rows the simulator answers after ``delay_ms``."""
    return [
        {
            "custom_id": f"{tag}-{i}",
            "messages": [{"role": "user", "content": f"[sim:delay-ms={delay_ms}] {tag} {i}"}],
        }
        for i in range(n)
    ]


async def get_batch(api: ApiClient, batch_id: str, key: str) -> dict[str, Any]:
    """``GET /v1/batches/{id}`` with ``key``; insist on 200."""
    status, body = await api.request("GET", f"/v1/batches/{batch_id}", key=key)
    assert status == 200, body
    return dict(body)


async def wait_batch(
    api: ApiClient, batch_id: str, key: str, statuses: set[str], timeout: float = 90
) -> dict[str, Any]:
    """Poll the batch until its status is one of ``statuses``."""

    async def reached() -> dict[str, Any] | None:
        batch = await get_batch(api, batch_id, key)
        return batch if batch["status"] in statuses else None

    return dict(await wait_until(reached, timeout, f"{batch_id} to reach {statuses}", 0.2))


async def open_job(page: Page, batch_id: str) -> None:
    """Go to the job page of ``batch_id`` (signed in)."""
    await page.goto(f"{page.url.split('#')[0]}#/jobs/{batch_id}")
    await expect(page.locator("#job-details")).to_contain_text(batch_id)


def badge(page: Page) -> Locator:
    """The job page's status badge."""
    return page.locator("#job-status [data-status]")


async def bar_sum(page: Page, chart: str, attribute: str) -> int:
    """The sum of ``attribute`` over the bars of chart ``#chart``."""
    values = await page.locator(f"#{chart} .bar").evaluate_all(
        f"(bars) => bars.map((b) => Number(b.getAttribute('{attribute}')))"
    )
    return sum(values)


async def deliveries(api: ApiClient, batch_id: str, key: str) -> dict[str, Any]:
    """The batch's webhook delivery log."""
    status, body = await api.request("GET", f"/v1/batches/{batch_id}/webhook_deliveries", key=key)
    assert status == 200, body
    return dict(body)
