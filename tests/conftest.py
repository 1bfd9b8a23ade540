"""Fixtures shared by every tier."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

OUTPUT_DIR = Path(os.environ.get("RELAY_TEST_OUTPUT", "test-output"))


@pytest.fixture(scope="session")
def output_dir() -> Path:
    """Where tests put artefacts (screenshots, logs)."""
    OUTPUT_DIR.mkdir(parents=True, exist_ok=True)
    return OUTPUT_DIR
