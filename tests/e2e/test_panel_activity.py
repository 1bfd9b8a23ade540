"""Issue 29, item 3: a job's timeline and the workspace's usage page in the panel
(Chromium, every service its own process), at a desktop and a phone's width (screenshots
in test-output/panel/)."""

from __future__ import annotations

import re
from pathlib import Path

from playwright.async_api import Page, expect

from tests.helpers.panel import deliveries, open_job, slow_rows, wait_batch
from tests.helpers.panel_browser import RUN_TIMEOUT_MS, both_widths, sign_in
from tests.helpers.support import ApiClient, WebhookReceiver, wait_until


async def test_the_job_page_shows_its_timeline_with_pause_resume_and_webhook(
    page: Page, panel_key: str, api: ApiClient, webhooks: WebhookReceiver, shots: Path
) -> None:
    job = await api.submit(
        {
            "model": "gpt-4o-mini",
            "name": "Timed",
            "requests": slow_rows(300, 20, "t"),
            "webhookUrl": webhooks.url,
        },
        key=panel_key,
    )
    for verb in ("pause", "resume"):
        status, body = await api.request("POST", f"/v1/batches/{job['id']}/{verb}", key=panel_key)
        assert status == 200, body
    await wait_batch(api, job["id"], panel_key, {"completed"})

    async def delivered() -> bool:
        log = await deliveries(api, job["id"], panel_key)
        return log["status"] == "delivered"

    await wait_until(delivered, 30, "the webhook to be delivered")
    await sign_in(page, panel_key)
    await open_job(page, job["id"])
    events = page.locator("#job-timeline li")
    await expect(events.last).to_have_attribute(
        "data-event", "webhook_attempt", timeout=RUN_TIMEOUT_MS
    )
    kinds = await events.evaluate_all("(items) => items.map((li) => li.dataset.event)")
    assert sorted(kinds) == sorted(
        ["created", "started", "paused", "resumed", "finished", "webhook_attempt"]
    ), kinds
    assert kinds[0] == "created" and kinds[-2:] == ["finished", "webhook_attempt"], kinds
    assert kinds.index("paused") < kinds.index("resumed"), kinds
    await expect(page.locator("#job-timeline li[data-event='finished']")).to_contain_text(
        "Finished completed"
    )
    await expect(page.locator("#job-timeline li[data-event='webhook_attempt']")).to_contain_text(
        "Webhook attempt 1 delivered HTTP 204"
    )
    times = await page.locator("#job-timeline li time").evaluate_all(
        "(ts) => ts.map((t) => t.getAttribute('datetime'))"
    )
    assert times == sorted(times) and len(times) == 6
    await both_widths(page, shots, "job-timeline")


async def test_the_usage_page_sums_rows_tokens_and_cost_per_day_and_model(
    page: Page, panel_key: str, api: ApiClient, shots: Path
) -> None:
    made = []
    for model, n in (("sim-priced", 3), ("sim-priced", 2), ("gpt-4o-mini", 4)):
        made.append(
            await api.submit(
                {"model": model, "name": f"{model} {n}", "requests": slow_rows(n, 0, "u")},
                key=panel_key,
            )
        )
    ended = [await wait_batch(api, job["id"], panel_key, {"completed"}) for job in made]
    status, usage = await api.request("GET", "/v1/usage", key=panel_key)
    assert status == 200, usage
    by_model = {line["model"]: line for line in usage["data"]}
    assert {m: (line["jobs"], line["rows"]) for m, line in by_model.items()} == {
        "sim-priced": (2, 5),
        "gpt-4o-mini": (1, 4),
    }
    priced = sum(job["cost_usd"] for job in ended if job["model"] == "sim-priced")
    assert abs(by_model["sim-priced"]["cost_usd"] - priced) < 1e-6
    tokens = sum(j["usage"]["prompt_tokens"] + j["usage"]["completion_tokens"] for j in ended)

    await sign_in(page, panel_key)
    await page.get_by_role("link", name="Usage").click()
    await expect(page.get_by_role("heading", name="Usage", level=1)).to_be_visible()
    await expect(page.locator("#usage-rows")).to_have_text("9")
    await expect(page.locator("#usage-failed")).to_have_text("0")
    await expect(page.locator("#usage-tokens")).to_have_text(f"{tokens:,}")
    models = page.locator("#usage-models-body tr")
    await expect(models).to_have_count(2)
    await expect(models.first).to_have_attribute("data-model", "sim-priced")  # costliest first
    await expect(models.first.locator("td").nth(2)).to_have_text("5")
    day = usage["to"]
    await expect(page.locator(f"#usage-days-body tr[data-day='{day}']")).to_have_count(2)
    await both_widths(page, shots, "usage")

    await page.get_by_label("From", exact=True).fill("2020-01-01")
    await page.get_by_label("To", exact=True).fill("2020-01-02")
    await page.get_by_role("button", name="Show").click()
    await expect(page.locator("#usage-empty")).to_be_visible()
    await expect(page.locator("#usage-rows")).to_have_text("0")
    await page.get_by_label("From", exact=True).fill("2020-01-01")
    await page.get_by_label("To", exact=True).fill("2020-12-31")
    await page.get_by_role("button", name="Show").click()
    await expect(page.locator("#usage-error")).to_contain_text("at most 92 days")


async def test_the_workers_page_shows_what_each_worker_holds_and_the_queues(
    page: Page, panel_key: str, api: ApiClient, shots: Path
) -> None:
    job = await api.submit(
        {"model": "gpt-4o-mini", "name": "Busy fleet", "requests": slow_rows(400, 300, "w")},
        key=panel_key,
    )

    async def holding() -> dict[str, object] | None:
        status, fleet = await api.request("GET", "/v1/workers", key=panel_key)
        assert status == 200, fleet
        mine = [j for w in fleet["workers"] for j in w["jobs"] if j["id"] == job["id"]]
        return fleet if mine else None

    fleet = await wait_until(holding, 30, "a worker to report holding the job's rows")
    (worker,) = fleet["workers"]  # the e2e system runs one row-worker of 8 slots
    assert worker["concurrency"] == 8
    assert {q["queue"] for q in fleet["queues"]} >= {"dispatch", "rows", "notify"}
    status, other = await api.request("GET", "/v1/workers", key=api.key)  # workspace A
    assert all(j["id"] != job["id"] for w in other["workers"] for j in w["jobs"]), other

    await sign_in(page, panel_key)
    await page.get_by_role("link", name="Workers").click()
    await expect(page.get_by_role("heading", name="Workers", level=1)).to_be_visible()
    await expect(page.locator("#workers-summary")).to_have_text("1 row-worker live")
    row = page.locator("#workers-body tr")
    await expect(row).to_have_count(1)
    await expect(row.get_by_role("link", name="Busy fleet")).to_be_visible()
    await expect(row.locator("td").nth(1)).to_have_text(re.compile(r"^\d+ / 8$"))
    await expect(page.locator("#queues-body tr[data-queue='rows']")).to_have_count(1)
    await expect(page.locator("#throttled-list li")).to_have_count(1)
    await both_widths(page, shots, "workers")
    status, _ = await api.request("POST", f"/v1/batches/{job['id']}/cancel", key=panel_key)
    assert status == 200
    await expect(row.get_by_role("link", name="Busy fleet")).to_have_count(0, timeout=30_000)
