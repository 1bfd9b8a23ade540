"""The status model: transition tables over the enums, terminal sets, allowed-from sets,
SQL constants rendered from them, and the migrations' CHECK lists equal to the enums."""

from __future__ import annotations

import re
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import TypeVar

import orjson
import pytest

from relay_batches.ledger.migrate import migration_files
from relay_batches.ledger.status_sql import status_in
from relay_batches.messages import SCHEMA_VERSION, JobEvent, MessageError
from relay_batches.model import (
    CANCELABLE,
    DELIVERY_INITIAL,
    DELIVERY_SETTLED,
    DELIVERY_STATUS_TRANSITIONS,
    JOB_INITIAL,
    JOB_STATUS_TRANSITIONS,
    PAUSABLE,
    TERMINAL,
    DeliveryStatus,
    JobStatus,
    allowed_from,
    delivery_allowed_from,
)

S = TypeVar("S", bound=StrEnum)

_STATEMENT_TABLE = re.compile(r"(?:CREATE TABLE IF NOT EXISTS|ALTER TABLE)\s+(\w+)", re.I)
_STATUS_CHECK = re.compile(r"CHECK\s*\(\s*status\s+IN\s*\(([^)]*)\)", re.I)
_DROPS_STATUS_CHECK = re.compile(r"DROP CONSTRAINT IF EXISTS\s+\w+_status_check", re.I)


def migrated_status_checks() -> dict[str, list[str]]:
    """Each table's CHECK list on ``status`` after every migration, in migration order."""
    checks: dict[str, list[str]] = {}
    for _, sql in migration_files():
        body = "\n".join(line.split("--")[0] for line in sql.splitlines())
        for statement in body.split(";"):
            table = _STATEMENT_TABLE.search(statement)
            if table is None:
                continue
            if _DROPS_STATUS_CHECK.search(statement):
                checks.pop(table.group(1), None)
            for found in _STATUS_CHECK.finditer(statement):
                checks[table.group(1)] = re.findall(r"'([^']*)'", found.group(1))
    return checks


def test_the_migrations_check_exactly_the_enum_values() -> None:
    checks = migrated_status_checks()
    assert sorted(checks) == ["batches", "webhook_deliveries"]
    assert sorted(checks["batches"]) == sorted(JobStatus)
    assert sorted(checks["webhook_deliveries"]) == sorted(DeliveryStatus)


def reachable(initial: frozenset[S], transitions: Mapping[S, frozenset[S]]) -> set[S]:
    seen, todo = set(initial), list(initial)
    while todo:
        for nxt in transitions[todo.pop()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen


@pytest.mark.parametrize(
    ("enum", "initial", "transitions", "terminal"),
    [(JobStatus, JOB_INITIAL, JOB_STATUS_TRANSITIONS, TERMINAL)],
)
def test_a_transition_table_covers_its_enum_and_ends_in_its_terminal_set(
    enum: type[StrEnum],
    initial: frozenset[StrEnum],
    transitions: Mapping[StrEnum, frozenset[StrEnum]],
    terminal: frozenset[StrEnum],
) -> None:
    assert set(transitions) == set(enum)
    assert all(isinstance(s, enum) for targets in transitions.values() for s in targets)
    assert all(not transitions[s] for s in terminal)
    assert all(transitions[s] for s in set(enum) - terminal)
    assert all(src not in targets for src, targets in transitions.items())
    assert reachable(initial, transitions) == set(enum)


def test_a_delivery_settles_and_moves_on_from_there_only_when_re_armed() -> None:
    transitions = DELIVERY_STATUS_TRANSITIONS
    assert set(transitions) == set(DeliveryStatus)
    assert all(src not in targets for src, targets in transitions.items())
    assert reachable(DELIVERY_INITIAL, transitions) == set(DeliveryStatus)
    assert all(transitions[s] == {"retrying"} for s in DELIVERY_SETTLED)
    assert transitions[DeliveryStatus.RETRYING] == {"sending", "failed"}


def test_the_job_table_is_the_one_the_ledger_makes() -> None:
    assert {src: sorted(dst) for src, dst in JOB_STATUS_TRANSITIONS.items() if dst} == {
        "queued": ["canceled", "completed", "expired", "failed", "paused", "running"],
        "scheduled": ["canceled"],
        "running": ["canceled", "completed", "expired", "failed", "paused"],
        "paused": ["canceled", "completed", "expired", "failed", "queued"],
    }
    assert TERMINAL == {"completed", "failed", "canceled", "expired"}
    assert JOB_INITIAL == {"queued", "scheduled"}


def test_allowed_from_reads_the_table_backwards_in_enum_order() -> None:
    assert allowed_from(JobStatus.CANCELED) == ["queued", "scheduled", "running", "paused"]
    assert allowed_from(JobStatus.FAILED) == ["queued", "running", "paused"]
    assert allowed_from(JobStatus.RUNNING) == ["queued"]
    assert allowed_from(JobStatus.COMPLETED) == ["queued", "running", "paused"]
    assert allowed_from(JobStatus.PAUSED) == ["queued", "running"]
    assert allowed_from(JobStatus.QUEUED) == ["paused"]
    assert CANCELABLE == set(allowed_from(JobStatus.CANCELED))
    assert delivery_allowed_from(DeliveryStatus.SENDING) == ["retrying"]
    assert delivery_allowed_from(DeliveryStatus.POSTING) == ["sending"]
    assert delivery_allowed_from(DeliveryStatus.DELIVERED) == ["posting", "unknown"]
    assert delivery_allowed_from(DeliveryStatus.REFUSED) == ["posting", "unknown"]
    assert delivery_allowed_from(DeliveryStatus.FAILED) == [
        "sending",
        "posting",
        "unknown",
        "retrying",
    ]
    assert delivery_allowed_from(DeliveryStatus.UNKNOWN) == ["posting"]
    assert delivery_allowed_from(DeliveryStatus.RETRYING) == [
        "posting",
        "delivered",
        "refused",
        "failed",
        "unknown",
    ]
    assert DELIVERY_SETTLED == {"delivered", "refused", "failed"}


def test_status_constants_render_in_enum_order() -> None:
    assert status_in([JobStatus.QUEUED]) == "status IN ('queued')"
    assert status_in(TERMINAL) == "status IN ('completed', 'failed', 'canceled', 'expired')"
    with pytest.raises(ValueError):
        status_in([])


def test_a_job_event_decodes_to_the_enum_and_refuses_an_unknown_status() -> None:
    event = JobEvent.decode(JobEvent("b", JobStatus.RUNNING, 1, 0, 0).encode())
    assert event.status is JobStatus.RUNNING
    body = {"v": SCHEMA_VERSION, "kind": "job", "batch_id": "b", "status": "sleeping"}
    with pytest.raises(MessageError):
        JobEvent.decode(orjson.dumps({**body, "total": 1, "completed": 0, "failed": 0}))


def test_the_panel_uses_the_model_terminal_and_cancelable_sets() -> None:
    dom = (Path(__file__).parents[2] / "services/ingest_api/panel/static/dom.js").read_text()
    sets = {
        name: set(re.findall(r'"(\w+)"', values))
        for name, values in re.findall(r"export const (\w+) = new Set\(\[([^\]]*)\]\)", dom)
    }
    assert sets["TERMINAL"] == TERMINAL
    assert sets["CANCELABLE"] == CANCELABLE
    assert sets["PAUSABLE"] == PAUSABLE
