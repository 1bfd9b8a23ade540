"""Operating a batch from the panel (issue 14), in real headless Chromium against the
e2e system: a running job's cost, rate, ETA, partial results and charts; pause, resume,
retry of failed rows, the delivery log and redelivery, delete. Split from test_panel.py.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from playwright.async_api import Browser, Page, expect

from relay_batches.ids import new_id
from tests.helpers.panel import (
    badge,
    bar_sum,
    deliveries,
    get_batch,
    open_job,
    slow_rows,
    wait_batch,
    watch_panel,
)
from tests.helpers.panel_browser import RESULTS_PAGE, RUN_TIMEOUT_MS, job_row, sign_in
from tests.helpers.processes import System
from tests.helpers.support import ApiClient, free_port, past_redelivery_cooldown, wait_until

# --- operating a running batch (issue 14) -----------------------------------------------

LIVE_NOTE = "Rows finished so far; the job has not ended yet."


async def test_a_running_job_shows_cost_rate_eta_partial_results_and_charts_and_pauses(
    page: Page, panel_key: str, api: ApiClient, shots: Path
) -> None:
    job = await api.submit(
        {"model": "sim-priced", "name": "Live", "requests": slow_rows(400, 200), "budget_usd": 500},
        key=panel_key,
    )
    await sign_in(page, panel_key)
    await open_job(page, job["id"])
    await expect(badge(page)).to_have_text("running", timeout=RUN_TIMEOUT_MS)
    await expect(page.locator("#count-cost")).to_have_text(re.compile(r"^\$(?!0\.00$)\d+\.\d+$"))
    await expect(page.locator("#cost-label")).to_have_text("cost of $500.00 budget")
    await expect(page.locator("#job-details dt:text-is('Budget') + dd")).to_have_text("$500.00")
    await expect(page.locator("#count-rate")).to_have_text(re.compile(r"^\d+(\.\d)?$"))
    await expect(page.locator("#count-eta")).to_have_text(re.compile(r"^\d+:\d\d$"))
    await expect(page.locator("#results-note")).to_have_text(LIVE_NOTE)
    first = page.locator("#results-body tr").first
    await expect(first.locator("td").nth(1)).to_have_text("slow-0")
    await expect(first.locator("td").nth(2)).to_have_text("echo: [sim:delay-ms=200] slow 0")
    await expect(page.locator("#chart-progress svg .bar").first).to_be_visible()
    await expect(page.locator("#chart-latency svg .bar")).to_have_count(13)
    await expect(page.locator("#download-csv")).to_be_disabled()
    await page.screenshot(path=shots / "job-running.png", full_page=True)

    await page.get_by_role("button", name="Pause").click()
    await expect(badge(page)).to_have_text("paused")
    assert (await get_batch(api, job["id"], panel_key))["status"] == "paused"
    await expect(page.get_by_role("button", name="Resume")).to_be_visible()
    await expect(page.get_by_role("button", name="Pause")).to_be_hidden()
    await expect(page.locator("#rate-item")).to_be_hidden()
    await expect(page.locator("#results-note")).to_have_text(LIVE_NOTE)  # partial while paused
    await page.screenshot(path=shots / "job-paused.png", full_page=True)
    status, _ = await api.request("POST", f"/v1/batches/{job['id']}/cancel", key=panel_key)
    assert status == 200


async def test_resume_runs_a_paused_job_to_the_end_with_every_row_once(
    page: Page, panel_key: str, api: ApiClient
) -> None:
    # More rows than the e2e dispatch window (256), so the job cannot end while paused.
    job = await api.submit(
        {"model": "gpt-4o-mini", "name": "Held", "requests": slow_rows(400, 50, "held")},
        key=panel_key,
    )
    status, paused = await api.request("POST", f"/v1/batches/{job['id']}/pause", key=panel_key)
    assert (status, paused["status"]) == (200, "paused"), paused
    await sign_in(page, panel_key)
    await open_job(page, job["id"])
    await expect(badge(page)).to_have_text("paused")
    await expect(page.get_by_role("button", name="Pause")).to_be_hidden()

    await page.get_by_role("button", name="Resume").click()
    await expect(page.get_by_role("button", name="Resume")).to_be_hidden()
    resumed = await get_batch(api, job["id"], panel_key)
    assert resumed["status"] in {"queued", "running", "completed"}, resumed
    await expect(badge(page)).to_have_text("completed", timeout=RUN_TIMEOUT_MS)
    ended = await get_batch(api, job["id"], panel_key)
    assert (ended["completed"], ended["failed"]) == (400, 0)
    status, body = await api.request("GET", f"/v1/batches/{job['id']}/results", key=panel_key)
    assert status == 200
    assert [row["custom_id"] for row in body["data"]] == [f"held-{i}" for i in range(400)]
    await expect(page.locator("#results-note")).to_have_text("")
    await expect(page.locator("#results-body tr")).to_have_count(RESULTS_PAGE)


async def test_retry_failed_rows_makes_a_job_of_the_dead_letter_that_then_succeeds(
    page: Page, panel_key: str, api: ApiClient, shots: Path
) -> None:
    flaky = f"[sim:fail-first=4] flaky {new_id()}"  # 4 failures: dead-lettered, then answers
    requests = [
        {"custom_id": "fine-1", "messages": [{"role": "user", "content": "fine 1"}]},
        {"custom_id": "flaky", "messages": [{"role": "user", "content": flaky}]},
        {"custom_id": "fine-2", "messages": [{"role": "user", "content": "fine 2"}]},
    ]
    job = await api.submit(
        {"model": "gpt-4o-mini", "name": "Flaky", "requests": requests}, key=panel_key
    )
    ended = await wait_batch(api, job["id"], panel_key, {"completed"})
    assert (ended["completed"], ended["failed"], ended["dead_letter"]) == (2, 1, 1)
    await sign_in(page, panel_key)
    await open_job(page, job["id"])
    await expect(page.locator("#dead-body tr")).to_have_count(1)
    await expect(page.locator("#dead-body td").first).to_have_text("flaky")
    await expect(page.locator("#chart-progress svg")).to_be_visible()
    assert await bar_sum(page, "chart-progress", "data-completed") == 2
    assert await bar_sum(page, "chart-progress", "data-failed") == 1  # stacked in red
    await expect(page.locator("#chart-progress rect.fail[height]:not([height='0'])")).to_have_count(
        1
    )
    await page.get_by_label("Show row details").check()
    await expect(page.locator("#dead-heads th")).to_have_text(
        ["custom_id", "Error", "Attempts", "Tokens (in / out)", "Deployment", "Latency", "Cost"]
    )
    await expect(page.locator("#dead-body td").nth(2)).to_have_text("4")
    await expect(page.locator("#dead-body td").nth(3)).to_have_text(re.compile(r"^\d+ / \d+$"))

    await page.get_by_role("button", name="Retry failed rows").click()
    await expect(page).not_to_have_url(re.compile(f"#/jobs/{job['id']}$"))
    retry_id = page.url.rsplit("/", 1)[1]
    await expect(page.locator("#job-details")).to_contain_text(retry_id)
    retry = await get_batch(api, retry_id, panel_key)
    assert (retry["retry_of"], retry["total"], retry["name"]) == (job["id"], 1, "Flaky")
    assert (await get_batch(api, job["id"], panel_key))["retries"] == [retry_id]
    await expect(page.locator("#job-details dt:text-is('Retry of') + dd a")).to_have_attribute(
        "href", f"#/jobs/{job['id']}"
    )
    await expect(badge(page)).to_have_text("completed", timeout=RUN_TIMEOUT_MS)
    status, body = await api.request("GET", f"/v1/batches/{retry_id}/results", key=panel_key)
    assert status == 200
    assert body["data"] == [{"custom_id": "flaky", "content": f"echo: {flaky}"}]
    await expect(page.get_by_role("button", name="Retry failed rows")).to_be_hidden()
    await page.screenshot(path=shots / "job-retry.png", full_page=True)


@dataclass
class FailingFirst:
    """A webhook receiver that answers 500 to the first POST and 204 to the others."""

    posts: list[dict[str, str]] = field(default_factory=list)
    port: int = 0

    @property
    def url(self) -> str:
        """Where to send webhooks."""
        return f"http://127.0.0.1:{self.port}/hook"

    async def hook(self, request: web.Request) -> web.Response:
        """Record the POST; fail the first."""
        await request.read()
        self.posts.append(dict(request.headers))
        return web.Response(status=500 if len(self.posts) == 1 else 204)


@pytest.fixture
async def failing_first() -> AsyncIterator[FailingFirst]:
    """A FailingFirst receiver listening on a free port."""
    receiver = FailingFirst(port=free_port())
    app = web.Application()
    app.router.add_post("/hook", receiver.hook)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", receiver.port).start()
    yield receiver
    await runner.cleanup()


async def test_a_finished_job_shows_details_the_delivery_log_and_charts_and_redelivers(
    page: Page,
    panel_key: str,
    api: ApiClient,
    failing_first: FailingFirst,
    shots: Path,
    system: System,
) -> None:
    job = await api.submit(
        {
            "model": "sim-priced",
            "name": "Hooked",
            "requests": slow_rows(6, 20, "hook"),
            "webhookUrl": failing_first.url,
        },
        key=panel_key,
    )
    await wait_batch(api, job["id"], panel_key, {"completed"})

    async def settled(count: int, status: str) -> dict[str, Any] | None:
        log = await deliveries(api, job["id"], panel_key)
        return log if len(log["data"]) == count and log["status"] == status else None

    first = await wait_until(lambda: settled(1, "failed"), 30, "the first attempt to fail")
    assert first["data"][0]["response_status"] == 500
    await sign_in(page, panel_key)
    await open_job(page, job["id"])
    # all realtime at the realtime reference's price: nothing saved
    saved = page.locator("#job-details dt:text-is('Saved') + dd")
    await expect(saved).to_have_text(re.compile(r"^\$0\.00 \(0%\) against \$0\.\d+ all-realtime$"))
    lanes = page.locator("#job-details dt:text-is('Cost per lane') + dd li")
    await expect(lanes).to_have_text([re.compile(r"^realtime: 6 rows, \$0\.\d+$")])
    attempts = page.locator("#deliveries-body tr")
    await expect(attempts).to_have_count(1)
    await expect(attempts.first.locator("td").nth(1)).to_have_text("failed")
    await expect(attempts.first.locator("td").nth(2)).to_have_text("500")
    error = first["data"][0]["error"] or "—"  # an answer's status is no error of its own
    await expect(attempts.first.locator("td").nth(5)).to_have_text(error)
    await expect(attempts.first.locator("td").nth(6)).to_have_text("no")
    await expect(page.locator("#delivery-state [data-status]")).to_have_text("failed")

    await page.get_by_label("Show row details").check()
    heads = page.locator("#results-heads th")
    await expect(heads).to_have_text(
        [
            "#",
            "custom_id",
            "Content or error",
            "Tokens (in / out)",
            "Attempts",
            "Deployment",
            "Latency",
            "Finish",
            "Cost",
        ]
    )
    cells = page.locator("#results-body tr").first.locator("td")
    await expect(cells.nth(3)).to_have_text(re.compile(r"^\d+ / \d+$"))
    await expect(cells.nth(4)).to_have_text("1")
    await expect(cells.nth(5)).to_have_text("sim-priced")
    await expect(cells.nth(6)).to_have_text(re.compile(r"^[\d,]+ ms$"))
    await expect(cells.nth(7)).to_have_text("stop")
    await expect(cells.nth(8)).to_have_text(re.compile(r"^\$0\.\d+$"))
    await expect(page.locator("#results-body tr")).to_have_count(6)

    await expect(page.locator("#chart-latency svg .bar")).to_have_count(13)
    assert await bar_sum(page, "chart-progress", "data-completed") == 6
    assert await bar_sum(page, "chart-progress", "data-failed") == 0
    assert await bar_sum(page, "chart-latency", "data-count") == 6
    await expect(page.locator("#chart-latency .chart-summary")).to_contain_text("6 rows · p50")
    await page.screenshot(path=shots / "job-details-deliveries.png", full_page=True)

    await past_redelivery_cooldown(system.iso.database_url, job["id"])
    await page.get_by_role("button", name="Redeliver").click()
    await expect(page.locator("#delivery-note")).to_have_text("Redelivery scheduled (retrying).")
    log = await wait_until(lambda: settled(2, "delivered"), 30, "the redelivery")
    assert [(a["attempt"], a["status"], a["redelivery"]) for a in log["data"]] == [
        (1, "failed", False),
        (2, "delivered", True),
    ]
    assert [h["webhook-id"] for h in failing_first.posts] == [f"msg_{job['id']}"] * 2
    await expect(attempts).to_have_count(2)
    await expect(attempts.nth(1).locator("td").nth(1)).to_have_text("delivered")
    await expect(attempts.nth(1).locator("td").nth(6)).to_have_text("yes")
    await expect(page.locator("#delivery-state [data-status]")).to_have_text("delivered")
    await expect(page.get_by_role("button", name="Redeliver")).to_be_enabled()


async def test_the_panel_check_reports_object_text_and_empty_value_cells(
    browser: Browser, system: System, panel_key: str
) -> None:
    context = await browser.new_context()
    problems: list[str] = []
    await watch_panel(context, problems)
    opened = await context.new_page()
    await opened.goto(f"{system.api_url}/panel")
    await sign_in(opened, panel_key)
    await opened.evaluate(
        """() => {
          const dl = document.getElementById("job-usage");
          const dd = document.createElement("dd");
          dd.textContent = String([document.createElement("dt")]);
          dl.append(document.createElement("dt"), dd, document.createElement("dd"));
        }"""
    )

    async def reported() -> bool:
        return len(problems) >= 2

    await wait_until(reported, 10, "the check to report")
    await context.close()
    assert any(p.startswith("# text: ") and "Usage [object HTMLElement]" in p for p in problems)
    assert any(p.startswith("empty <dd> # in #job-usage: ") for p in problems), problems


async def test_delete_an_ended_job_and_a_template_from_their_pages_after_a_confirm(
    page: Page, panel_key: str, api: ApiClient, shots: Path
) -> None:
    done = await api.submit(
        {
            "model": "gpt-4o-mini",
            "name": "Done",
            "requests": [{"messages": [{"role": "user", "content": "x"}]}],
        },
        key=panel_key,
    )
    weekly = await api.submit(
        {
            "model": "gpt-4o-mini",
            "name": "Weekly",
            "cron": "0 6 * * 1",
            "requests": [{"messages": [{"role": "user", "content": "y"}]}],
        },
        key=panel_key,
    )
    await wait_batch(api, done["id"], panel_key, {"completed"})
    await sign_in(page, panel_key)
    await open_job(page, done["id"])
    await expect(badge(page)).to_have_text("completed")

    await page.get_by_role("button", name="Delete job").click()
    dialog = page.get_by_role("dialog")
    await expect(dialog).to_contain_text('"Done" (completed) is deleted for good')
    await page.screenshot(path=shots / "delete-dialog.png")
    await dialog.get_by_role("button", name="Keep it").click()
    await expect(dialog).to_be_hidden()
    assert (await get_batch(api, done["id"], panel_key))["status"] == "completed"

    await page.get_by_role("button", name="Delete job").click()
    await dialog.get_by_role("button", name="Delete job").click()
    await expect(page.get_by_role("heading", name="Jobs", level=1)).to_be_visible()
    await expect(page.locator("#flash")).to_have_text("Deleted job Done")
    await expect(job_row(page, "Weekly")).to_have_count(1)
    await expect(job_row(page, "Done")).to_have_count(0)
    status, _ = await api.request("GET", f"/v1/batches/{done['id']}", key=panel_key)
    assert status == 404

    await job_row(page, "Weekly").get_by_role("link", name="Weekly").click()
    await expect(badge(page)).to_have_text("scheduled")
    await page.get_by_role("button", name="Delete job").click()
    await expect(dialog).to_contain_text("spawns no more runs")
    await dialog.get_by_role("button", name="Delete job").click()
    await expect(page.locator("#flash")).to_have_text("Deleted job Weekly")
    await expect(page.locator("#jobs-empty")).to_be_visible()
    status, _ = await api.request("GET", f"/v1/batches/{weekly['id']}", key=panel_key)
    assert status == 404


async def test_a_running_job_offers_no_delete(page: Page, panel_key: str, api: ApiClient) -> None:
    job = await api.submit(
        {"model": "gpt-4o-mini", "name": "Busy", "requests": slow_rows(300, 200)}, key=panel_key
    )
    await sign_in(page, panel_key)
    await open_job(page, job["id"])
    await expect(page.get_by_role("button", name="Cancel job")).to_be_visible()
    await expect(page.get_by_role("button", name="Delete job")).to_be_hidden()
    await api.request("POST", f"/v1/batches/{job['id']}/cancel", key=panel_key)
    await expect(badge(page)).to_have_text("canceled")
    await expect(page.get_by_role("button", name="Delete job")).to_be_visible()
