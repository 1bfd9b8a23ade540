"""The settings' declarations: one per ``RELAY_*`` variable, complete, the only way any
process reads one, and the source of the generated configuration page."""

from __future__ import annotations

import re
from pathlib import Path

from relay_batches.settings import GROUPS, Settings, every_setting
from relay_batches.settings.declare import (
    RELAY,
    RELAY_BATCH,
    RELAY_DEV,
    SECTIONS,
    SERVICES,
    UPSTREAM_SIM,
    declarations,
)
from relay_batches.settings.docs import COMMAND, PAGE, main, render

ROOT = Path(__file__).resolve().parents[2]
SETTINGS_PACKAGE = ROOT / "libs" / "relay_batches" / "settings"
NAME = re.compile(r"RELAY_[A-Z0-9_]+")
# A read of a variable by name, bypassing the declarations.
DIRECT_READ = re.compile(r"""(getenv\(|\.get\(|environ\[)\s*f?["']RELAY_""")


def _sources() -> list[Path]:
    return [
        path
        for folder in ("libs", "services")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if SETTINGS_PACKAGE not in path.parents
    ]


def test_the_configuration_page_is_what_the_declarations_generate() -> None:
    page = ROOT / PAGE
    assert page.exists() and page.read_text(encoding="utf-8") == render(), (
        f"{PAGE} differs from the settings' declarations in libs/relay_batches/settings/:"
        f" run `{COMMAND}` (python -m relay_batches.settings.docs) and commit the page"
    )


def test_the_generator_writes_the_page_and_checks_it(tmp_path: Path) -> None:
    out = tmp_path / "configuration.md"
    assert main(["--check", "--out", str(out)]) == 1  # missing
    assert main(["--out", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == render()
    assert main(["--check", "--out", str(out)]) == 0
    out.write_text(render() + "stale\n", encoding="utf-8")
    assert main(["--check", "--out", str(out)]) == 1


def test_every_section_is_a_heading_with_a_table_operator_settings_first() -> None:
    page = render()
    headings = [line[3:] for line in page.splitlines() if line.startswith("## ")]
    assert headings == [section.title for section in SECTIONS]
    assert headings[0] == "Essentials"
    for declared in every_setting():
        assert page.count(f"| `{declared.env}` |") == 1, declared.env


def test_each_variable_is_declared_once_with_a_doc_a_section_and_its_readers() -> None:
    names = [declared.env for declared in every_setting()]
    assert len(names) == len(set(names)) == 95
    readers = {*SERVICES, RELAY, RELAY_BATCH, RELAY_DEV, UPSTREAM_SIM}
    for declared in every_setting():
        assert NAME.fullmatch(declared.env), declared.env
        assert declared.doc.endswith(".") and "\n" not in declared.doc, declared.env
        assert declared.section in SECTIONS, declared.env
        assert declared.services and set(declared.services) <= readers, declared.env


def test_a_services_setting_is_named_after_its_attribute() -> None:
    for attribute, declared in declarations(Settings):
        assert declared.env == f"RELAY_{attribute.upper()}"


def test_every_group_reads_its_defaults_from_an_empty_environment() -> None:
    for group in GROUPS:
        assert group.from_env({}) == group()  # type: ignore[attr-defined]


def test_every_relay_variable_the_code_names_is_declared() -> None:
    declared = {setting.env for setting in every_setting()}
    for path in _sources():
        for name in set(NAME.findall(path.read_text(encoding="utf-8"))):
            if name.endswith("_"):  # a family, RELAY_SIM_* or RELAY_COOLDOWN_*
                assert any(d.startswith(name) for d in declared), f"{path}: {name}"
            else:
                assert name in declared, f"{path}: {name} is not a declared setting"


def test_no_process_reads_a_relay_variable_but_through_its_declaration() -> None:
    readers = [
        str(path.relative_to(ROOT))
        for path in _sources()
        if DIRECT_READ.search(path.read_text(encoding="utf-8"))
    ]
    assert readers == [], "these read RELAY_* by name: read them through relay_batches.settings"


def test_a_direct_read_is_recognised() -> None:
    for line in (
        'os.environ.get("RELAY_X")',
        "env.get('RELAY_SIM_HOST', '')",
        'os.getenv("RELAY_X")',
        'os.environ["RELAY_X"]',
    ):
        assert DIRECT_READ.search(line), line
    assert not DIRECT_READ.search('child.env["RELAY_HEALTH_PORT"] = str(port)')
