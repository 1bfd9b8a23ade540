"""Issue 29, item 3: the job list's search (name, id, metadata) and bulk cancel and delete
(Chromium, every service its own process), at a desktop and a phone's width (screenshots in
test-output/panel/)."""

from __future__ import annotations

from pathlib import Path

from playwright.async_api import Page, expect

from tests.helpers.panel import slow_rows, wait_batch
from tests.helpers.panel_browser import both_widths, job_row, sign_in
from tests.helpers.support import ApiClient


async def submit(
    api: ApiClient, key: str, name: str, rows: int, delay_ms: int, **more: object
) -> dict[str, object]:
    """A job of ``rows`` rows answered after ``delay_ms``."""
    body = {"model": "gpt-4o-mini", "name": name, "requests": slow_rows(rows, delay_ms), **more}
    return dict(await api.submit(body, key=key))


async def list_ids(api: ApiClient, key: str, query: str) -> list[str]:
    """The ids ``GET /v1/batches?<query>`` lists."""
    status, body = await api.request("GET", f"/v1/batches?limit=100&{query}", key=key)
    assert status == 200, body
    return [b["id"] for b in body["data"]]


async def test_search_finds_jobs_by_name_id_and_metadata(
    page: Page, panel_key: str, api: ApiClient, shots: Path
) -> None:
    alpha = await submit(api, panel_key, "Alpha reviews", 1, 0, metadata={"team": "search"})
    beta = await submit(api, panel_key, "Beta chats", 1, 0, metadata={"team": "ads"})
    gamma = await submit(api, panel_key, "Gamma", 1, 0)
    assert await list_ids(api, panel_key, "search=REVIEWS") == [alpha["id"]]
    assert await list_ids(api, panel_key, f"search={beta['id']}") == [beta["id"]]
    assert await list_ids(api, panel_key, "search=ads") == [beta["id"]]
    assert await list_ids(api, panel_key, "search=team") == [beta["id"], alpha["id"]]
    assert await list_ids(api, panel_key, "search=team%3Dads") == [beta["id"]]  # team=ads
    assert await list_ids(api, panel_key, "search=team%20%3D%20search") == [alpha["id"]]
    status, body = await api.request("GET", "/v1/batches?search=" + "x" * 257, key=panel_key)
    assert (status, body["error"]["param"]) == (400, "search")

    await sign_in(page, panel_key)
    await expect(page.locator("#jobs-body tr")).to_have_count(3)
    search = page.get_by_label("Search")
    await search.fill("alpha")
    await expect(page.locator("#jobs-body tr")).to_have_count(1)
    await expect(job_row(page, "Alpha reviews")).to_have_count(1)
    await search.fill(str(gamma["id"]))
    await expect(page.locator("#jobs-body tr")).to_have_count(1)
    await expect(job_row(page, "Gamma")).to_have_count(1)
    await search.fill("team=ads")  # a metadata pair
    await expect(page.locator("#jobs-body tr")).to_have_count(1)
    await expect(job_row(page, "Beta chats")).to_have_count(1)
    await search.fill("search")  # a metadata value
    await expect(page.locator("#jobs-body tr")).to_have_count(1)
    await expect(job_row(page, "Alpha reviews")).to_have_count(1)
    await both_widths(page, shots, "job-search")
    await search.fill("nothing like it")
    await expect(page.locator("#jobs-empty")).to_be_visible()
    await search.fill("")
    await expect(page.locator("#jobs-body tr")).to_have_count(3)


async def test_select_several_jobs_to_cancel_then_delete_them(
    page: Page, panel_key: str, api: ApiClient, shots: Path
) -> None:
    slow = [await submit(api, panel_key, f"Slow {i}", 300, 200) for i in range(2)]
    done = await submit(api, panel_key, "Done", 1, 0)
    await wait_batch(api, str(done["id"]), panel_key, {"completed"})
    await sign_in(page, panel_key)
    await expect(page.locator("#jobs-body tr")).to_have_count(3)
    await expect(page.get_by_role("region", name="Selected jobs")).to_be_hidden()

    for name in ("Slow 0", "Slow 1", "Done"):
        await page.get_by_label(f"Select {name}", exact=True).check()
    bar = page.get_by_role("region", name="Selected jobs")
    await expect(bar).to_contain_text("3 selected")
    await expect(page.locator("#jobs-body tr.selected")).to_have_count(3)
    await expect(page.get_by_label("Select every job of this page")).to_be_checked()
    await expect(bar.get_by_role("button", name="Cancel 2 selected")).to_be_enabled()
    await expect(bar.get_by_role("button", name="Delete 1 selected")).to_be_enabled()
    await both_widths(page, shots, "job-bulk-selected")

    await bar.get_by_role("button", name="Cancel 2 selected").click()
    dialog = page.get_by_role("dialog")
    await expect(dialog.get_by_role("heading")).to_have_text("Cancel 2 jobs?")
    await expect(dialog.locator("li")).to_have_count(2)
    await dialog.get_by_role("button", name="Cancel 2 jobs").click()
    await expect(page.locator("#bulk-note")).to_have_text("Canceled 2 jobs.")
    for job in slow:
        await expect(job_row(page, str(job["name"])).locator("[data-status]")).to_have_text(
            "canceled"
        )
    await expect(bar).to_contain_text("1 selected")  # Done stays selected

    await page.get_by_label("Select every job of this page").check()
    await expect(bar.get_by_role("button", name="Delete 3 selected")).to_be_enabled()
    await expect(bar.get_by_role("button", name="Cancel 0 selected")).to_be_disabled()
    await bar.get_by_role("button", name="Delete 3 selected").click()
    await dialog.get_by_role("button", name="Keep them").click()
    assert len(await list_ids(api, panel_key, "")) == 3  # kept
    await bar.get_by_role("button", name="Delete 3 selected").click()
    await dialog.get_by_role("button", name="Delete 3 jobs").click()
    await expect(page.locator("#bulk-note")).to_have_text("Deleted 3 jobs.")
    await expect(page.locator("#jobs-empty")).to_be_visible()
    await expect(bar).to_be_hidden()
    assert await list_ids(api, panel_key, "") == []
