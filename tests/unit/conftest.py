"""Unit fixtures: the dispatcher's ledger and bus fakes, fresh for each test."""

from __future__ import annotations

import pytest

from tests.helpers.fakes import FakeDispatchStore, Recorder


@pytest.fixture
def store() -> FakeDispatchStore:
    """The dispatcher's ledger in memory."""
    return FakeDispatchStore()


@pytest.fixture
def recorder() -> Recorder:
    """What the dispatcher publishes, recorded."""
    return Recorder()
