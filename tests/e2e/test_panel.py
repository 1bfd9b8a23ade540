"""The panel in real headless Chromium (Debian's package, driven by Playwright) against the
e2e system: every service its own process. Assertions are on the DOM; screenshots of the
job list and a job page land in ``test-output/panel/`` for a person to look at.
"""

from __future__ import annotations

import asyncio
import csv
import io
from pathlib import Path

import orjson
from playwright.async_api import Page, expect

from tests.helpers.panel_browser import RESULTS_PAGE, RUN_TIMEOUT_MS, job_row, sign_in, upload
from tests.helpers.processes import System
from tests.helpers.support import ApiClient

REVIEWS_CSV = 'Classify: great product\n"Classify: good, but pricey"\nClassify: meh\n'
CHATS_JSONL = b"".join(
    orjson.dumps({"custom_id": f"chat-{i}", "messages": [{"role": "user", "content": f"hi {i}"}]})
    + b"\n"
    for i in range(30)
)


async def workspace_jobs(system: System, key: str, api: ApiClient) -> list[dict[str, object]]:
    """The jobs of ``key``'s workspace, through the public API."""
    status, body = await api.request("GET", "/v1/batches?limit=100", key=key)
    assert status == 200, body
    return list(body["data"])


async def test_sign_in_refuses_a_bad_key_and_sign_out_forgets_the_key(
    page: Page, panel_key: str
) -> None:
    await page.get_by_label("API key").fill("rk_wrong")
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.locator("#api-key-error")).to_have_text("invalid API key")
    await expect(page.get_by_role("navigation", name="Main")).to_be_hidden()

    await page.get_by_label("API key").fill(panel_key)
    await page.keyboard.press("Enter")  # keyboard-usable: Enter submits the form
    await expect(page.get_by_role("heading", name="Jobs", level=1)).to_be_visible()
    assert await page.evaluate("sessionStorage.getItem('relay.apiKey')") == panel_key
    await expect(page.locator("#jobs-empty")).to_be_visible()

    await page.get_by_role("button", name="Sign out").click()
    await expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    assert await page.evaluate("sessionStorage.getItem('relay.apiKey')") is None


async def test_upload_two_files_watch_them_complete_open_a_job_and_download(
    page: Page, panel_key: str, tmp_path: Path, shots: Path, system: System, api: ApiClient
) -> None:
    reviews, chats = tmp_path / "reviews.csv", tmp_path / "chats.jsonl"
    reviews.write_text(REVIEWS_CSV)
    chats.write_bytes(CHATS_JSONL)
    await sign_in(page, panel_key)
    await page.evaluate("window.relayNoReload = true")

    await upload(page, [reviews, chats], **{"Priority": "4", "Budget in USD (optional)": "2.5"})
    await expect(page.get_by_role("status")).to_contain_text("Created 2 jobs")
    await expect(page.locator("#jobs-body tr")).to_have_count(2)
    for name, total in (("reviews.csv", 3), ("chats.jsonl", 30)):
        row = job_row(page, name)
        await expect(row.locator("[data-status]")).to_have_text("completed", timeout=RUN_TIMEOUT_MS)
        await expect(row.get_by_role("progressbar")).to_have_attribute("aria-valuenow", "100")
        await expect(row).to_contain_text(f"{total} / {total} (100%)")
        await expect(row.get_by_role("button", name=f"Cancel {name}")).to_have_count(0)
        await expect(row.locator("td").nth(4)).to_have_text("4")
    assert await page.evaluate("window.relayNoReload") is True  # live, without a reload
    jobs = await workspace_jobs(system, panel_key, api)
    assert [job["budget_usd"] for job in jobs] == [2.5, 2.5]
    await page.screenshot(path=shots / "job-list.png", full_page=True)

    await page.get_by_role("link", name="reviews.csv", exact=True).click()
    await expect(page.get_by_role("heading", name="reviews.csv", level=1)).to_be_visible()
    await expect(page.locator("#count-completed")).to_have_text("3")
    await expect(page.locator("#count-failed")).to_have_text("0")
    results = page.locator("#results-body tr")
    await expect(results).to_have_count(3)
    await expect(results.nth(1)).to_contain_text("echo: Classify: good, but pricey")
    await expect(page.locator("#dead-note")).to_have_text("No dead letters.")
    await page.screenshot(path=shots / "job-page.png", full_page=True)

    jsonl = await download(page, "Download JSONL")
    assert [orjson.loads(line) for line in jsonl.splitlines()] == [
        {"custom_id": "row-1", "content": "echo: Classify: great product"},
        {"custom_id": "row-2", "content": "echo: Classify: good, but pricey"},
        {"custom_id": "row-3", "content": "echo: Classify: meh"},
    ]
    table = list(csv.reader(io.StringIO(await download(page, "Download CSV"), newline="")))
    assert table == [
        ["custom_id", "content", "error"],
        ["row-1", "echo: Classify: great product", ""],
        ["row-2", "echo: Classify: good, but pricey", ""],
        ["row-3", "echo: Classify: meh", ""],
    ]

    await page.get_by_role("link", name="All jobs").click()
    await page.get_by_role("link", name="chats.jsonl", exact=True).click()
    await expect(page.locator("#results-page")).to_have_text("Rows 1–25")
    await expect(page.locator("#results-body tr")).to_have_count(25)
    await page.get_by_role("button", name="Next").click()
    await expect(page.locator("#results-page")).to_have_text("Rows 26–30")
    await expect(page.locator("#results-body tr").first).to_contain_text("chat-25")
    await expect(page.get_by_role("button", name="Next")).to_be_disabled()


async def download(page: Page, button: str) -> str:
    """Click a download button; return the downloaded file's text."""
    async with page.expect_download() as info:
        await page.get_by_role("button", name=button).click()
    downloaded = await info.value
    path = await downloaded.path()
    # Bytes, not read_text: its newline translation would turn a CR inside a cell into LF.
    return (await asyncio.to_thread(Path(path).read_bytes)).decode("utf-8")


async def test_cancel_a_running_slow_job(
    page: Page, panel_key: str, tmp_path: Path, system: System, api: ApiClient, shots: Path
) -> None:
    slow = tmp_path / "slow.csv"
    slow.write_text("".join(f"[sim:delay-ms=200] slow {i}\n" for i in range(400)))
    await sign_in(page, panel_key)
    await upload(page, [slow])
    row = job_row(page, "slow.csv")
    await expect(row.locator("[data-status]")).to_have_text("running", timeout=RUN_TIMEOUT_MS)

    await page.screenshot(path=shots / "job-list-running.png", full_page=True)
    await row.get_by_role("button", name="Cancel slow.csv").click()
    dialog = page.get_by_role("dialog")
    await expect(dialog).to_contain_text("slow.csv")
    await page.screenshot(path=shots / "cancel-dialog.png")
    await dialog.get_by_role("button", name="Cancel job").click()
    await expect(row.locator("[data-status]")).to_have_text("canceled")
    await expect(row.get_by_role("button", name="Cancel slow.csv")).to_have_count(0)

    (job,) = await workspace_jobs(system, panel_key, api)
    assert job["status"] == "canceled"
    assert int(job["completed"]) < 400  # type: ignore[call-overload]


async def test_a_malformed_jsonl_line_is_shown_by_its_file_and_creates_no_job(
    page: Page, panel_key: str, tmp_path: Path, system: System, api: ApiClient, shots: Path
) -> None:
    good, bad = tmp_path / "good.csv", tmp_path / "bad.jsonl"
    good.write_text("fine\n")
    bad.write_bytes(CHATS_JSONL[: CHATS_JSONL.index(b"\n") + 1] + b"\n{not json\n")
    await sign_in(page, panel_key)
    await upload(page, [good, bad])

    bad_item = page.locator("#file-list li").filter(has_text="bad.jsonl")
    await expect(bad_item.get_by_role("alert")).to_contain_text(
        "'bad.jsonl' line 3: not valid JSON"
    )
    await expect(
        page.locator("#file-list li").filter(has_text="good.csv").get_by_role("alert")
    ).to_have_count(0)
    await expect(page.get_by_label("Files (.csv, .jsonl)")).to_have_attribute(
        "aria-invalid", "true"
    )
    assert await workspace_jobs(system, panel_key, api) == []
    await page.screenshot(path=shots / "upload-error.png", full_page=True)

    await page.get_by_role("link", name="Jobs", exact=True).click()
    await expect(page.locator("#jobs-empty")).to_be_visible()


async def test_a_cron_template_shows_its_schedule_and_cancels_from_its_page(
    page: Page, panel_key: str, tmp_path: Path
) -> None:
    weekly = tmp_path / "weekly.csv"
    weekly.write_text("prompt\nsummarise the week\n")
    await sign_in(page, panel_key)
    await upload(
        page,
        [weekly],
        **{"Name (optional)": "Weekly", "Cron schedule (optional, UTC)": "0 6 * * 1"},
    )
    row = job_row(page, "Weekly")
    await expect(row.locator("[data-status]")).to_have_text("scheduled")
    await row.get_by_role("link", name="Weekly").click()

    details = page.locator("#job-details")
    await expect(details).to_contain_text("0 6 * * 1")
    await expect(details.locator("dt", has_text="Next run")).to_have_count(1)
    await expect(page.locator("#job-runs")).to_have_text("No runs yet.")
    await expect(page.locator("#results-note")).to_have_text("Results appear when the job ends.")
    await expect(page.get_by_role("button", name="Download CSV")).to_be_disabled()

    await page.get_by_role("button", name="Cancel job").click()
    await page.get_by_role("dialog").get_by_role("button", name="Cancel job").click()
    await expect(page.locator("#job-status [data-status]")).to_have_text("canceled")
    await expect(page.get_by_role("button", name="Cancel job")).to_be_hidden()
    await expect(page.locator("#results-note")).to_have_text("No results.")


FORMULA_IDS = ['=HYPERLINK("http://example.invalid","x")', "+1", "-2", "@SUM(A1)", "\t=1", "\r=2"]


async def test_the_csv_download_neutralises_cells_a_spreadsheet_would_run_as_formulas(
    page: Page, panel_key: str, api: ApiClient
) -> None:
    requests = [
        {"custom_id": custom_id, "messages": [{"role": "user", "content": f"formula {i}"}]}
        for i, custom_id in enumerate(FORMULA_IDS)
    ]
    job = await api.submit({"model": "gpt-4o-mini", "requests": requests}, key=panel_key)
    await sign_in(page, panel_key)
    await page.goto(f"{page.url.split('#')[0]}#/jobs/{job['id']}")
    await expect(page.locator("#job-status [data-status]")).to_have_text(
        "completed", timeout=RUN_TIMEOUT_MS
    )
    await expect(page.locator("#results-body tr")).to_have_count(len(FORMULA_IDS))

    table = list(csv.reader(io.StringIO(await download(page, "Download CSV"), newline="")))
    assert table[1:] == [
        ["'" + custom_id, f"echo: formula {i}", ""] for i, custom_id in enumerate(FORMULA_IDS)
    ]
    jsonl = await download(page, "Download JSONL")  # the data itself is unchanged
    assert [orjson.loads(line)["custom_id"] for line in jsonl.splitlines()] == FORMULA_IDS


# Issue 27: a spreadsheet skips leading blanks (ASCII or Unicode spaces, zero-width
# characters) and reads full-width ＝ ＋ － ＠ as their ASCII forms, so these run as formulas too.
HIDDEN_FORMULAS = [
    " =1+1",
    '\u200b=HYPERLINK("http://example.invalid","x")',
    "＝1+1",
    "＋1",
    "－2",
    "＠SUM(A1)",
    "\u00a0\u3000+1",
    " \u200c\u200d\u2060\ufeff-2",
    "\n@SUM(A1)",
    "\u200b ＝1",
]
HARMLESS = ["", "hello", " hello", "\u200bhello", "   ", "1-2", "a=b", "ok ＝", "１２"]


async def test_the_csv_cell_text_neutralises_formulas_behind_blanks_and_full_width_signs(
    page: Page,
) -> None:
    cells = await page.evaluate(
        """async (values) => {
            const { csvText } = await import("/panel/static/export.js");
            return values.map(csvText);
        }""",
        FORMULA_IDS + HIDDEN_FORMULAS + HARMLESS,
    )
    assert cells == ["'" + v for v in FORMULA_IDS + HIDDEN_FORMULAS] + HARMLESS


async def test_an_expired_job_shows_as_ended_with_its_deadline_metadata_and_kept_results(
    page: Page, panel_key: str, api: ApiClient, shots: Path
) -> None:
    requests = [
        {
            "custom_id": f"e-{i}",
            "messages": [{"role": "user", "content": f"[sim:delay-ms=300] {i}"}],
        }
        for i in range(400)
    ]
    job = await api.submit(
        {
            "model": "gpt-4o-mini",
            "name": "Short window",
            "requests": requests,
            "completion_window": "3s",
            "metadata": {"team": "search"},
        },
        key=panel_key,
    )
    await sign_in(page, panel_key)
    await page.get_by_label("Status").select_option("expired")
    row = job_row(page, "Short window")
    await expect(row.locator("[data-status]")).to_have_text("expired", timeout=RUN_TIMEOUT_MS)
    await expect(row.get_by_role("button", name="Cancel Short window")).to_have_count(0)
    await page.screenshot(path=shots / "job-list-expired.png", full_page=True)

    await row.get_by_role("link", name="Short window").click()
    await expect(page.locator("#job-status [data-status]")).to_have_text("expired")
    details = page.locator("#job-details")
    expires = details.locator("dt:text-is('Expires') + dd time")
    await expect(expires).to_have_attribute("datetime", job["expires_at"])
    await expect(details.locator(".metadata li")).to_have_text(["team search"])
    await expect(page.get_by_role("button", name="Cancel job")).to_be_hidden()
    await expect(page.get_by_role("button", name="Download CSV")).to_be_enabled()
    await expect(page.locator("#job-usage dt")).to_have_text(
        ["prompt tokens", "completion tokens", "cached tokens"]
    )
    status, ended = await api.request("GET", f"/v1/batches/{job['id']}", key=panel_key)
    assert status == 200, ended
    kept = ended["completed"] + ended["failed"]
    assert 0 < kept < 400
    await expect(page.locator("#results-body tr")).to_have_count(min(kept, RESULTS_PAGE))
    await page.screenshot(path=shots / "job-expired.png", full_page=True)


async def test_an_openai_file_uploads_with_the_model_from_its_rows(
    page: Page, panel_key: str, tmp_path: Path, system: System, api: ApiClient
) -> None:
    openai_file = tmp_path / "openai.jsonl"
    line = {
        "custom_id": "o-1",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]},
    }
    openai_file.write_bytes(orjson.dumps(line) + b"\n")
    await sign_in(page, panel_key)
    await page.get_by_role("link", name="New batch").click()
    await expect(page.get_by_label("Model")).to_have_value("gpt-4o-mini")
    await page.get_by_label("Model").select_option(label="From each file's rows")
    await page.get_by_label("Files (.csv, .jsonl)").set_input_files([openai_file])
    await page.get_by_role("button", name="Create jobs").click()
    await expect(job_row(page, "openai.jsonl")).to_be_visible()
    (job,) = await workspace_jobs(system, panel_key, api)
    assert (job["name"], job["model"], job["total"]) == ("openai.jsonl", "gpt-4o-mini", 1)
