"""Issue 29, item 3: the New batch form takes every job-level field and shows, before
anything is sent, which CSV column the prompts come from (Chromium, every service its own
process). Screenshots at a desktop and a phone's width: test-output/panel/.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from playwright.async_api import Page, expect

from tests.helpers.panel import wait_batch
from tests.helpers.panel_browser import both_widths, job_row, sign_in
from tests.helpers.processes import System
from tests.helpers.support import ApiClient


async def only_job(api: ApiClient, key: str) -> dict[str, object]:
    """The workspace's one job, through the public API."""
    status, body = await api.request("GET", "/v1/batches?limit=10", key=key)
    assert status == 200, body
    (job,) = body["data"]
    return dict(job)


async def new_batch(page: Page, files: list[Path]) -> None:
    """Open the form and choose files."""
    await page.get_by_role("link", name="New batch").click()
    await expect(page.get_by_label("Model")).to_have_value("gpt-4o-mini")
    await page.get_by_label("Files (.csv, .jsonl)").set_input_files(files)


async def test_every_job_field_of_the_form_reaches_the_job(
    page: Page, panel_key: str, tmp_path: Path, api: ApiClient, shots: Path, system: System
) -> None:
    prompts = tmp_path / "prompts.csv"
    prompts.write_text("prompt\nsay one\nsay two\n")
    await both_widths(page, shots, "sign-in")
    await sign_in(page, panel_key)
    await new_batch(page, [prompts])
    preview = page.locator("#file-list li .csv-preview")
    await expect(preview).to_contain_text(
        "CSV · prompts from column “prompt” (its header row skipped) · 2 rows"
    )
    await expect(preview).to_contain_text("First prompt: “say one”")

    await page.get_by_label("Name (optional)").fill("Tuned")
    await page.get_by_label("Priority").fill("7")
    await page.get_by_label("Budget in USD (optional)").fill("3")
    await page.get_by_label("Temperature").fill("0.2")
    await page.get_by_label("Max tokens").fill("64")
    await page.get_by_label("Other parameters (JSON)").fill('{"seed": 7, "stop": ["END"]}')
    await page.get_by_label("Completion window (optional)").fill("2h")
    await page.get_by_label("Metadata (optional)").fill("team=search\nticket = OPS-12\n")
    await both_widths(page, shots, "submit-form")
    await page.get_by_role("button", name="Create jobs").click()
    await expect(job_row(page, "Tuned")).to_have_count(1)

    job = await only_job(api, panel_key)
    assert (job["name"], job["priority"], job["budget_usd"], job["total"]) == ("Tuned", 7, 3.0, 2)
    assert job["metadata"] == {"team": "search", "ticket": "OPS-12"}
    assert job["params"] == {"seed": 7, "stop": ["END"], "temperature": 0.2, "max_tokens": 64}
    window = datetime.fromisoformat(str(job["expires_at"])) - datetime.fromisoformat(
        str(job["created_at"])
    )
    assert abs(window.total_seconds() - 7200) < 5, window
    await page.get_by_role("link", name="Tuned").click()
    params = page.locator("#job-details dt:text-is('Parameters') + dd")
    await expect(params).to_contain_text('"temperature": 0.2')
    await expect(page.locator("#job-details .metadata li")).to_have_text(
        ["team search", "ticket OPS-12"]
    )
    await wait_batch(api, str(job["id"]), panel_key, {"completed"})


async def test_a_bad_field_is_shown_under_it_and_creates_no_job(
    page: Page, panel_key: str, tmp_path: Path, api: ApiClient, shots: Path
) -> None:
    one = tmp_path / "one.csv"
    one.write_text("hello\n")
    await sign_in(page, panel_key)
    await new_batch(page, [one])
    await expect(page.locator("#file-list .csv-preview")).to_contain_text(
        "prompts from its only column (no header row) · 1 row"
    )
    await page.get_by_label("Temperature").fill("9")
    await page.get_by_label("Completion window (optional)").fill("9 years")
    await page.get_by_role("button", name="Create jobs").click()
    await expect(page.locator("#temperature-error")).to_contain_text("temperature")
    await expect(page.get_by_label("Temperature")).to_have_attribute("aria-invalid", "true")
    await page.get_by_label("Temperature").fill("")
    await page.get_by_role("button", name="Create jobs").click()
    await expect(page.locator("#completion_window-error")).to_contain_text("completion_window")
    await page.get_by_label("Completion window (optional)").fill("")
    await page.get_by_label("Metadata (optional)").fill("no equals sign")
    await page.get_by_role("button", name="Create jobs").click()
    await expect(page.locator("#metadata-error")).to_have_text(
        "Metadata line 1 must read key=value."
    )
    await page.get_by_label("Metadata (optional)").fill("")
    await page.get_by_label("Other parameters (JSON)").fill("{nope")
    await page.get_by_role("button", name="Create jobs").click()
    await expect(page.locator("#params-error")).to_have_text(
        "Other parameters must be a JSON object."
    )
    await both_widths(page, shots, "submit-form-errors")
    status, body = await api.request("GET", "/v1/batches?limit=10", key=panel_key)
    assert (status, body["data"]) == (200, [])


async def test_a_csv_of_several_columns_shows_them_and_sends_the_chosen_ones(
    page: Page, panel_key: str, tmp_path: Path, api: ApiClient, shots: Path
) -> None:
    table = tmp_path / "tickets.csv"
    table.write_text('id,prompt,owner\nt-1,"Summarise: late, again",ann\nt-2,Summarise: fine,bob\n')
    await sign_in(page, panel_key)
    await new_batch(page, [table])
    preview = page.locator("#file-list .csv-preview")
    await expect(preview).to_contain_text("CSV · 3 columns: id, prompt, owner · 2 rows")
    await expect(page.get_by_label("Prompt column")).to_have_value("1")
    await expect(page.get_by_label("ID column")).to_have_value("0")
    await expect(preview).to_contain_text("First prompt: “Summarise: late, again”")
    await expect(preview).to_contain_text("Sent as tickets.jsonl")
    await page.get_by_label("Prompt column").select_option(label="owner")
    await expect(preview).to_contain_text("First prompt: “ann”")
    await page.get_by_label("Prompt column").select_option(label="prompt")
    await both_widths(page, shots, "submit-csv-columns")
    await page.get_by_role("button", name="Create jobs").click()
    await expect(job_row(page, "tickets.jsonl")).to_have_count(1)

    job = await only_job(api, panel_key)
    await wait_batch(api, str(job["id"]), panel_key, {"completed"})
    status, body = await api.request("GET", f"/v1/batches/{job['id']}/results", key=panel_key)
    assert status == 200, body
    assert body["data"] == [
        {"custom_id": "t-1", "content": "echo: Summarise: late, again"},
        {"custom_id": "t-2", "content": "echo: Summarise: fine"},
    ]


async def test_a_csv_without_a_prompt_named_column_asks_for_one(
    page: Page, panel_key: str, tmp_path: Path, api: ApiClient
) -> None:
    table = tmp_path / "odd.csv"
    table.write_text("key,question_text\nk1,why?\n")
    await sign_in(page, panel_key)
    await new_batch(page, [table])
    await expect(page.get_by_label("Prompt column")).to_have_value("-1")
    await page.get_by_role("button", name="Create jobs").click()
    item = page.locator("#file-list li").filter(has_text="odd.csv")
    await expect(item.get_by_role("alert")).to_have_text("Choose the prompt column of 'odd.csv'.")
    await page.get_by_label("Prompt column").select_option(label="question_text")
    await page.get_by_role("button", name="Create jobs").click()
    await expect(job_row(page, "odd.jsonl")).to_have_count(1)
    job = await only_job(api, panel_key)
    await wait_batch(api, str(job["id"]), panel_key, {"completed"})
    status, body = await api.request("GET", f"/v1/batches/{job['id']}/results", key=panel_key)
    assert body["data"] == [{"custom_id": "k1", "content": "echo: why?"}], (status, body)
