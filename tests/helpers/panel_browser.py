"""The browser side of the panel's tests: Debian's Chromium through Playwright, a signed-in
page of a workspace of the test's own, screenshots at a desktop and a phone width, and the
small steps every panel test takes (sign in, upload, find a job's row).

Test modules import the fixtures by name (``browser``, ``panel_key``, ``page``, ``shots``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from playwright.async_api import Browser, Locator, Page, async_playwright, expect

from relay_batches.ids import new_id
from relay_batches.services.relay_cli import admin
from tests.helpers.panel import scan_now, watch_panel
from tests.helpers.processes import System

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
UI_TIMEOUT_MS = 20_000
RUN_TIMEOUT_MS = 90_000  # a whole (small) job, on a shared 2-core machine

# The outermost elements that stick out past the right edge (those not inside a box that
# scrolls sideways), for the message of a failed check.
WIDE_ELEMENTS = """(width) => {
  const out = [];
  for (const el of document.querySelectorAll("body *")) {
    if (el.parentElement?.closest(".table-scroll")) continue;
    if (el.getBoundingClientRect().right <= width + 1) continue;
    if (el.parentElement && el.parentElement.getBoundingClientRect().right > width + 1) continue;
    out.push(`${el.tagName.toLowerCase()}#${el.id}.${el.className}`);
  }
  return out.slice(0, 10);
}"""
RESULTS_PAGE = 25  # result rows the job page shows at a time (rows.js)
DESKTOP = {"width": 1366, "height": 900}
PHONE = {"width": 390, "height": 844}  # a phone held upright (iPhone 12 to 15)


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Browser]:
    """Debian's Chromium, headless; never a browser downloaded by Playwright."""
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(
            executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True
        )
        yield launched
        await launched.close()


@pytest.fixture
async def panel_key(system: System) -> str:
    """A key of a workspace of the test's own, so its job list starts empty."""
    created = await admin.create_key(system.iso.database_url, f"panel-{new_id()[:12]}")
    return created.key


@pytest.fixture
async def page(browser: Browser, system: System) -> AsyncIterator[Page]:
    """A fresh browser context (own session storage) on the panel, every page of it
    checked for ``[object`` text and empty value cells (tests/helpers/panel.py)."""
    context = await browser.new_context(accept_downloads=True, viewport=DESKTOP)
    context.set_default_timeout(UI_TIMEOUT_MS)
    problems: list[str] = []
    await watch_panel(context, problems)
    opened = await context.new_page()
    errors: list[str] = []
    opened.on("pageerror", lambda error: errors.append(str(error)))
    await opened.goto(f"{system.api_url}/panel")
    yield opened
    problems += await scan_now(opened)
    await context.close()
    assert errors == [], f"uncaught errors in the panel: {errors}"
    assert problems == [], "the panel showed a bad value:\n" + "\n".join(problems)


@pytest.fixture
def shots(output_dir: Path) -> Path:
    """Where the screenshots go."""
    folder = output_dir / "panel"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


async def sign_in(page: Page, key: str) -> None:
    """Sign in through the form and wait for the job list."""
    await page.get_by_label("API key").fill(key)
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.get_by_role("heading", name="Jobs", level=1)).to_be_visible()


async def upload(page: Page, files: list[Path], **fields: str) -> None:
    """Fill the New batch form and submit it."""
    await page.get_by_role("link", name="New batch").click()
    await expect(page.get_by_label("Model")).to_have_value("gpt-4o-mini")
    await page.get_by_label("Files (.csv, .jsonl)").set_input_files(files)
    for label, value in fields.items():
        await page.get_by_label(label).fill(value)
    await page.get_by_role("button", name="Create jobs").click()


def job_row(page: Page, name: str) -> Locator:
    """The job list's row whose name link reads ``name``."""
    link = page.get_by_role("link", name=name, exact=True)
    return page.locator("#jobs-body tr").filter(has=link)


async def both_widths(page: Page, shots: Path, name: str) -> None:
    """Screenshot the page at the desktop width (``<name>.png``) and at a phone's
    (``<name>-390.png``), and check the phone view: the page itself never scrolls sideways
    (a wide table scrolls in its own box) and the main heading is on screen. The
    viewport is set back to the desktop width afterwards."""
    await page.screenshot(path=shots / f"{name}.png", full_page=True)
    await page.set_viewport_size(PHONE)
    try:
        await page.evaluate("window.scrollTo(0, 0)")
        heading = page.locator("section.view:not([hidden]) h1")
        await expect(heading).to_be_in_viewport()
        width = await page.evaluate("document.documentElement.scrollWidth")
        wide = await page.evaluate(WIDE_ELEMENTS, PHONE["width"])
        assert width <= PHONE["width"], f"{name}: the page is {width} px wide at 390 px: {wide}"
        await page.screenshot(path=shots / f"{name}-390.png", full_page=True)
    finally:
        await page.set_viewport_size(DESKTOP)
