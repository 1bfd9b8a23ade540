"""The installable project: one import namespace, ``relay_batches``, and nothing else.

The slow test builds the wheel from exactly what the Docker image copies (pyproject.toml,
libs/, services/), installs it into a fresh virtualenv and checks from there: the generic
names (``scheduler``, ``relay``, …) are not importable, every service is importable as
``relay_batches.services.<name>``, the package data is inside, every console script
answers ``--help``, and the dev-only packages (the upstream simulator, ``relay dev``) are
not in it, where ``relay dev`` says so. The fresh virtualenv sees the dependencies of the
dev virtualenv through a ``.pth`` line (no download), never the project itself.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from relay_batches.services.relay_cli.__main__ import DEV_MISSING
from tests.deploy.manifests import ROOT

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SERVICES = (
    "scheduler",
    "dispatcher",
    "aggregator",
    "notifier",
    "row_worker",
    "ingest_api",
    "relay_cli",
)
# In the source tree and its editable install, never in the wheel.
DEV_PACKAGES = tuple(PYPROJECT["tool"]["relay"]["dev-packages"])
FOREIGN_NAMES = (*SERVICES, "upstream_sim", "relay_dev", "relay")

PROBE = """
import importlib, importlib.metadata, json, sys
report = {"foreign": {}, "ours": {}, "scripts": {}}
for name in sys.argv[1].split(","):
    try:
        importlib.import_module(name)
        report["foreign"][name] = "imported"
    except ModuleNotFoundError as exc:
        report["foreign"][name] = "ModuleNotFoundError" if exc.name == name else repr(exc)
for name in sys.argv[2].split(","):
    report["ours"][name] = importlib.import_module(name).__file__
for ep in importlib.metadata.entry_points(group="console_scripts"):
    if ep.dist is not None and ep.dist.name == "relay-batches":
        report["scripts"][ep.name] = callable(ep.load())
print(json.dumps(report))
"""


def packages_on_disk() -> set[str]:
    """Every folder with an ``__init__.py`` under the package roots, as a dotted name."""
    found = set()
    for prefix, root in PYPROJECT["tool"]["setuptools"]["package-dir"].items():
        base = ROOT / root
        for init in base.rglob("__init__.py"):
            parts = init.parent.relative_to(base).parts
            if "__pycache__" not in parts:
                found.add(".".join((prefix, *parts)))
    return found


def test_the_packages_list_names_every_package_on_disk() -> None:
    listed = PYPROJECT["tool"]["setuptools"]["packages"]
    assert len(listed) == len(set(listed))
    assert set(listed) | set(DEV_PACKAGES) == packages_on_disk()
    assert not set(listed) & set(DEV_PACKAGES)
    assert DEV_PACKAGES == (
        "relay_batches.services.relay_dev",
        "relay_batches.services.upstream_sim",
    )


def test_the_editable_install_runs_the_dev_only_packages() -> None:
    """``make run`` and the tests run them from the tree, as the module they are."""
    assert all(importlib.util.find_spec(name) is not None for name in DEV_PACKAGES)
    scripts = PYPROJECT["project"]["scripts"]
    assert not [s for s, target in scripts.items() if target.startswith(DEV_PACKAGES)]


@dataclass(frozen=True)
class Install:
    """The project installed from its wheel into a fresh virtualenv."""

    venv: Path
    work: Path
    wheel: Path

    @property
    def bin(self) -> Path:
        """The virtualenv's scripts folder."""
        return self.venv / "bin"

    def run(self, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """Run a command in the virtualenv, outside the repository."""
        return subprocess.run(
            argv, cwd=self.work, env=_clean_env(), capture_output=True, text=True, timeout=timeout
        )


def _clean_env() -> dict[str, str]:
    """No RELAY_*, PYTHONPATH or virtualenv of the caller."""
    return {"PATH": "/usr/bin:/bin", "HOME": str(Path.home()), "LANG": "C.UTF-8"}


def _build(tmp: Path) -> Install:
    source = tmp / "source"
    source.mkdir()
    shutil.copy(ROOT / "pyproject.toml", source)
    for root in ("libs", "services"):
        shutil.copytree(ROOT / root, source / root, ignore=shutil.ignore_patterns("__pycache__"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    dist = tmp / "dist"
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(dist), str(source)],
        check=True,
        timeout=60,
    )
    (wheel,) = dist.glob("relay_batches-*.whl")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run(
        [*pip, "--python", str(python), "install", "--no-deps", "--no-index", str(wheel)],
        check=True,
        timeout=60,
    )
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    (Path(site) / "dev-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    work = tmp / "elsewhere"
    work.mkdir()
    return Install(venv, work, wheel)


@pytest.fixture(scope="module")
def install(tmp_path_factory: pytest.TempPathFactory) -> Install:
    """The wheel built and installed once for this module."""
    return _build(tmp_path_factory.mktemp("packaging"))


def test_only_relay_batches_is_importable_from_the_installed_wheel(install: Install) -> None:
    ours = ["relay_batches", *(f"relay_batches.services.{name}" for name in SERVICES)]
    result = install.run(
        str(install.bin / "python"), "-c", PROBE, ",".join(FOREIGN_NAMES), ",".join(ours)
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["foreign"] == dict.fromkeys(FOREIGN_NAMES, "ModuleNotFoundError")
    assert all(Path(path).is_relative_to(install.venv) for path in report["ours"].values())
    assert report["scripts"] == dict.fromkeys(PYPROJECT["project"]["scripts"], True)


def test_the_wheel_carries_migrations_the_panel_and_the_openapi_document(
    install: Install,
) -> None:
    result = install.run(
        str(install.bin / "python"), "-c", "import relay_batches; print(relay_batches.__file__)"
    )
    package = Path(result.stdout.strip()).parent
    assert package.is_relative_to(install.venv)
    migrations = ROOT / "libs" / "relay_batches" / "ledger" / "migrations"
    shipped = package / "ledger" / "migrations"
    assert sorted(p.name for p in shipped.glob("*.sql")) == sorted(
        p.name for p in migrations.glob("*.sql")
    )
    api = package / "services" / "ingest_api"
    assert (api / "openapi.json").read_bytes() == (
        ROOT / "services" / "ingest_api" / "openapi.json"
    ).read_bytes()
    static = ROOT / "services" / "ingest_api" / "panel" / "static"
    assert sorted(p.name for p in (api / "panel" / "static").iterdir()) == sorted(
        p.name for p in static.iterdir()
    )


def test_every_console_script_answers_help(install: Install) -> None:
    scripts = set(PYPROJECT["project"]["scripts"])
    for script in sorted(scripts):
        result = install.run(str(install.bin / script), "--help")
        assert (result.returncode, result.stderr) == (0, ""), script
        assert result.stdout.startswith(f"usage: {script}"), script


def test_the_wheel_carries_neither_the_simulator_nor_relay_dev(install: Install) -> None:
    folders = [name.replace(".", "/") + "/" for name in DEV_PACKAGES]
    names = zipfile.ZipFile(install.wheel).namelist()
    assert not [n for n in names if n.startswith(tuple(folders))]
    assert [n for n in names if n.startswith("relay_batches/services/relay_cli/")]
    probe = "import importlib.util, sys; print([importlib.util.find_spec(n) for n in sys.argv[1:]])"
    found = install.run(str(install.bin / "python"), "-c", probe, *DEV_PACKAGES)
    assert (found.returncode, found.stdout.strip()) == (0, "[None, None]"), found.stderr
    assert not (install.bin / "relay-upstream-sim").exists()
    dev = install.run(str(install.bin / "relay"), "dev")
    assert (dev.returncode, dev.stdout, dev.stderr.strip()) == (1, "", DEV_MISSING)
