"""What "nothing paid twice" means in a chaos run, read from the simulator's answers per
row (``GET /stats/answers``; every chaos row has its own content).

A row is paid twice when the simulator answered its request twice. One case is left by
design, the residual window of a row-worker's ``kill -9``: a call it had in flight (the
simulator may finish the answer before it notices the connection is gone: paid, never
received), or an answer it received whose outcome the broker had not confirmed yet (its
linger, ``RELAY_RESULTS_FLUSH_MS``, and a publish round trip). Nothing durable knows of
either, so the row runs again. Such a row's first answer came at most
:data:`RESIDUAL_BEFORE_S` before the kill or :data:`RESIDUAL_AFTER_S` after it (the
chaos calls take 40–80 ms; the margins are for a loaded machine). Every other row answered twice
is a defect; so is any row answered three times.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# Measured on a loaded 2-core machine: answers 8–20 ms before a kill, calls 8–9 ms after.
# Without the redelivery check a slice's answered rows spread over its whole run before
# the kill (0–0.4 s at 64 rows, 40 ms a call, 4 at once), most of them outside these.
RESIDUAL_BEFORE_S = 0.15
RESIDUAL_AFTER_S = 0.15


@dataclass(frozen=True)
class PaidCheck:
    """Rows answered twice: ``in_window`` of them first answered within the residual
    window of a row-worker kill, ``outside`` not; ``closest_s`` for each of the former,
    how long before the kill (negative: after it) its first answer came."""

    extra_answers: int
    rows_answered_twice: int
    most_answers: int
    in_window: int
    outside: list[float]
    closest_s: list[float]


def paid_check(paid: Mapping[str, Any], worker_kills: Sequence[float]) -> PaidCheck:
    """Sort the rows a run paid twice (``paid``: the simulator's answers) by whether the
    residual window of one of ``worker_kills`` (Unix seconds) explains them."""
    outside: list[float] = []
    closest: list[float] = []
    for first in paid["repeated_first_answered_at"]:
        gaps = [
            kill - first
            for kill in worker_kills
            if -RESIDUAL_AFTER_S <= kill - first <= RESIDUAL_BEFORE_S
        ]
        if gaps:
            closest.append(round(min(gaps, key=abs), 3))
        else:
            outside.append(first)
    return PaidCheck(
        int(paid["extra_answers"]),
        int(paid["rows_answered_twice"]),
        int(paid["most_answers"]),
        len(closest),
        outside,
        sorted(closest),
    )


UNCONFIRMED = "relay_outcome_unconfirmed_seconds_bucket"


def unconfirmed_shares(metrics_pages: Sequence[str]) -> dict[str, float]:
    """From row-workers' ``/metrics`` pages, the share of results messages whose oldest
    outcome was confirmed within each bucket of ``relay_outcome_unconfirmed_seconds``
    (answer to confirm: the residual window of a crash), every worker together."""
    counts: dict[str, float] = {}
    for page in metrics_pages:
        for line in page.splitlines():
            if line.startswith(UNCONFIRMED + "{"):
                bound = line.split('le="', 1)[1].split('"', 1)[0]
                counts[bound] = counts.get(bound, 0.0) + float(line.rsplit(" ", 1)[1])
    total = counts.get("+Inf", 0.0)
    return {bound: round(n / total, 4) for bound, n in counts.items()} if total else {}


def assert_paid_once(check: Mapping[str, Any], faults: object = None) -> None:
    """No row answered twice but in the residual window of a row-worker kill, none three
    times (``check``: a :class:`PaidCheck` as a dict, as the report holds it)."""
    most, outside = check["most_answers"], check["outside"]
    assert most <= 2, f"a row was paid {most} times: {check}; faults {faults}"
    assert not outside, (
        f"{len(outside)} rows paid twice outside the residual window: first answered at "
        f"{outside[:20]}; faults {faults}"
    )
