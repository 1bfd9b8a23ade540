"""Issue 29, item 1: failed rows in plain sight in the panel (Chromium, every service its
own process). A job with failed rows reads "completed · N failed" in the colour of failure
in the list and on its page, its progress bar is in segments (completed, failed, dead
letter), both charts stack the failed rows in red, and "Failed rows only" narrows the
results to them. Screenshots at a desktop and a phone's width: test-output/panel/.
"""

from __future__ import annotations

from pathlib import Path

from playwright.async_api import Page, expect

from tests.helpers.panel import bar_sum, open_job, wait_batch
from tests.helpers.panel_browser import both_widths, job_row, sign_in
from tests.helpers.support import ApiClient

RED = "rgb(179, 38, 30)"  # --danger
GREEN = "rgb(30, 122, 58)"  # --ok
DARK_RED = "rgb(92, 20, 16)"  # --dead


def message(custom_id: str, text: str) -> dict[str, object]:
    """One row of a native submission."""
    return {"custom_id": custom_id, "messages": [{"role": "user", "content": text}]}


async def colour(page: Page, selector: str, prop: str = "color") -> str:
    """The computed CSS ``prop`` of the first element matching ``selector``."""
    return str(
        await page.locator(selector).first.evaluate(
            f"(el) => getComputedStyle(el).getPropertyValue('{prop}')"
        )
    )


async def test_a_job_with_failed_rows_reads_failed_everywhere_and_filters_to_them(
    page: Page, panel_key: str, api: ApiClient, shots: Path
) -> None:
    # 40 rows: 34 answer, 4 are refused (400: failed at once), 2 fail 4 times (dead letter)
    rows = [message(f"ok-{i}", f"fine {i}") for i in range(34)]
    rows[3:3] = [message(f"bad-{i}", f"[sim:status=400] bad {i}") for i in range(4)]
    rows += [
        message(f"flaky-{i}", f"[sim:fail-first=4] flaky {i} {panel_key[-6:]}") for i in (0, 1)
    ]
    job = await api.submit(
        {"model": "gpt-4o-mini", "name": "Mixed", "requests": rows}, key=panel_key
    )
    clean = await api.submit(
        {"model": "gpt-4o-mini", "name": "Clean", "requests": [message("c", "fine")]},
        key=panel_key,
    )
    ended = await wait_batch(api, job["id"], panel_key, {"completed"})
    assert (ended["completed"], ended["failed"], ended["dead_letter"]) == (34, 6, 2)
    await wait_batch(api, clean["id"], panel_key, {"completed"})

    await sign_in(page, panel_key)
    mixed, fine = job_row(page, "Mixed"), job_row(page, "Clean")
    await expect(mixed.locator("[data-status]")).to_have_text("completed · 6 failed")
    await expect(mixed.locator(".status-with-failures")).to_have_count(1)
    await expect(fine.locator("[data-status]")).to_have_text("completed")
    await expect(fine.locator(".status-with-failures")).to_have_count(0)
    assert await colour(page, "#jobs-body .status-with-failures") == RED
    assert await colour(page, "#jobs-body .status-completed:not(.status-with-failures)") == GREEN
    bar = mixed.get_by_role("progressbar")
    await expect(bar).to_have_attribute("aria-valuenow", "100")
    await expect(bar).to_have_attribute(
        "aria-valuetext", "100%: 34 completed, 4 failed, 2 dead letter of 40"
    )
    for segment, count, paint in (
        ("completed", 34, GREEN),
        ("failed", 4, RED),
        ("dead-letter", 2, DARK_RED),
    ):
        seg = mixed.locator(f".seg-{segment}")
        await expect(seg).to_have_attribute("data-count", str(count))
        box = await seg.bounding_box()
        whole = await bar.bounding_box()
        assert box is not None and whole is not None
        assert abs(box["width"] - whole["width"] * count / 40) < 2, (segment, box, whole)
        assert (
            await colour(
                page, f"#jobs-body tr:has-text('Mixed') .seg-{segment}", "background-color"
            )
            == paint
        )
    await both_widths(page, shots, "failures-job-list")

    await open_job(page, job["id"])
    await expect(page.locator("#job-status [data-status]")).to_have_text("completed · 6 failed")
    await expect(page.locator("#failed-item")).to_have_class("alarm")
    await expect(page.locator("#count-failed")).to_have_text("6")
    await expect(page.locator("#count-dead")).to_have_text("2")
    await expect(page.locator("#job-progress .seg-failed")).to_have_attribute("data-count", "4")
    await expect(page.locator("#job-progress .seg-dead-letter")).to_have_attribute(
        "data-count", "2"
    )
    await expect(page.locator("#chart-latency svg")).to_be_visible()
    await expect(page.locator("#chart-progress svg")).to_be_visible()
    assert await bar_sum(page, "chart-progress", "data-failed") == 6
    assert await bar_sum(page, "chart-latency", "data-count") == 40
    assert await bar_sum(page, "chart-latency", "data-failed") == 6
    red_bars = page.locator("#chart-latency rect.fail:not([height='0'])")
    assert await red_bars.count() >= 1
    assert await colour(page, "#chart-latency rect.fail", "fill") == RED

    await expect(page.locator("#results-page")).to_have_text("Rows 1–25")
    await page.get_by_label("Failed rows only").check()
    results = page.locator("#results-body tr")
    await expect(results).to_have_count(6)
    ids = await results.locator("td:nth-child(2)").all_text_contents()
    assert sorted(ids) == sorted([f"bad-{i}" for i in range(4)] + ["flaky-0", "flaky-1"])
    await expect(page.locator("#results-body td.error-text")).to_have_count(6)
    await expect(page.get_by_role("button", name="Next")).to_be_disabled()
    await both_widths(page, shots, "failures-job-page")

    await page.get_by_label("Failed rows only").uncheck()
    await expect(results).to_have_count(25)

    await open_job(page, clean["id"])
    await page.get_by_label("Failed rows only").check()
    await expect(page.locator("#results-note")).to_have_text("No failed rows.")
    await expect(page.locator("#failed-item")).not_to_have_class("alarm")
