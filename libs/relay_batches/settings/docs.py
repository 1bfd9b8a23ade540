"""The configuration page, generated from the settings' declarations.

``python -m relay_batches.settings.docs`` (``make config-docs``) writes
``docs/operations/configuration.md``; with ``--check`` it writes nothing and exits 1 when
the committed page differs. A unit test keeps the page equal to the declarations.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from relay_batches.settings import GROUPS
from relay_batches.settings.declare import SECTIONS, SERVICES, Section, Setting, declarations

PAGE = Path("docs/operations/configuration.md")
COMMAND = "make config-docs"
HEADER = ("Variable", "Type", "Default", "Bounds", "Read by", "What it does")

INTRO = f"""\
# Configuration

<!-- Generated from libs/relay_batches/settings/ by `{COMMAND}`: edit the declarations
there, not this page. -->

Every setting is a `RELAY_*` environment variable, read once when a process starts; the
defaults work on a developer machine. An unset or empty variable takes its default. A bad
value stops the process with one line naming the variable (exit code 2), and every
service logs the settings it runs with at start (`starting`, passwords in URLs masked).

The first sections hold what an operator sets; the tuning knobs follow, and the last
three are read only by the command line and in development. In *Bounds*, *clamped* means
a value outside the range is brought within it; any other value outside is refused.
"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _readers(services: tuple[str, ...]) -> str:
    if set(SERVICES) <= set(services):
        rest = [s for s in services if s not in SERVICES]
        return ", ".join(["every service", *rest])
    return ", ".join(services)


def _default(declared: Setting, value: Any) -> str:
    if declared.default_doc:
        return declared.default_doc
    text = declared.kind.text(value)
    if text in ("", "``"):
        return "none" if value is None else "empty"
    return text


def _row(declared: Setting, value: Any) -> str:
    cells = (
        f"`{declared.env}`",
        declared.kind.type_text(),
        _default(declared, value),
        declared.kind.bounds(),
        _readers(declared.services),
        declared.doc,
    )
    return "| " + " | ".join(_cell(cell) for cell in cells) + " |"


def _section(section: Section, rows: list[str]) -> str:
    table = [
        "| " + " | ".join(HEADER) + " |",
        "|" + "---|" * len(HEADER),
        *rows,
    ]
    return f"## {section.title}\n\n{section.intro}\n\n" + "\n".join(table) + "\n"


def render() -> str:
    """The whole page, sections in their order, settings in declaration order."""
    rows: dict[Section, list[str]] = {section: [] for section in SECTIONS}
    for group in GROUPS:
        defaults = group()
        for attribute, declared in declarations(group):
            rows[declared.section].append(_row(declared, getattr(defaults, attribute)))
    parts = [INTRO, *(_section(s, rows[s]) for s in SECTIONS if rows[s])]
    return "\n".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    """Write the page (or with ``--check`` compare it); the exit code."""
    parser = argparse.ArgumentParser(prog="python -m relay_batches.settings.docs")
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 if stale")
    parser.add_argument("--out", type=Path, default=PAGE, help=f"the page (default: {PAGE})")
    args = parser.parse_args(argv)
    page = render()
    if args.check:
        current = args.out.read_text(encoding="utf-8") if args.out.exists() else ""
        if current != page:
            print(f"{args.out} is out of date: run `{COMMAND}`", file=sys.stderr)
            return 1
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(page, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
