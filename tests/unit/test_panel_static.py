"""The panel's static files: plain ES modules of this origin only (no CDN, no runtime
dependency), and no way for data to reach the page as HTML."""

from __future__ import annotations

import re

from relay_batches.services.ingest_api.panel.routes import STATIC_DIR, load_static

HTML_SINKS = ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(")
IMPORT = re.compile(r"""^\s*import\b[^;]*?from\s+["']([^"']+)["']""", re.M | re.S)
EXTERNAL = re.compile(r"""(?:src|href)\s*=\s*["'](?:https?:)?//""", re.I)


def test_no_script_writes_html_or_evaluates_text() -> None:
    for path in sorted(STATIC_DIR.glob("*.js")):
        text = path.read_text()
        assert [sink for sink in HTML_SINKS if sink in text] == [], path.name


def test_every_import_is_a_module_of_the_panel_itself() -> None:
    served = load_static()
    for path in sorted(STATIC_DIR.glob("*.js")):
        for target in IMPORT.findall(path.read_text()):
            assert target.startswith("./"), (path.name, target)
            assert target[2:] in served, (path.name, target)


def test_the_page_loads_nothing_from_another_origin() -> None:
    for name in ("index.html", "panel.css"):
        text = (STATIC_DIR / name).read_text()
        assert not EXTERNAL.search(text), name
        assert "@import" not in text and "url(http" not in text, name
