"""An alias's lanes as the planner sees them (:class:`~relay_batches.lanes.plan.LaneOffer`),
built from the routes file: each deployment's lane (batch, ``service_tier = "flex"``,
realtime), its price, and how fast it answers.

A batch deployment's expected turnaround is its declared ``turnaround`` until
:data:`LEARN_AFTER` of its provider batches ended on their own; then the longest of the
last ones (:func:`learned_turnaround`). A fast lane's rows a second are its measured
throughput when there is one (see :mod:`relay_batches.ledger.lane_rates`), else its
declared ``rows_per_s``, else what its ``rpm`` allows, never more than its ``rpm``
allows; else unknown.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from relay_batches.lanes.plan import LaneOffer
from relay_batches.router.aliases import AliasTable, Deployment

LEARN_AFTER = 3  # finished provider batches before the learned turnaround replaces the declared


def learned_turnaround(declared_s: float, observed_s: Sequence[float]) -> float:
    """The expected turnaround: the declared one until :data:`LEARN_AFTER` batches were
    observed, then the longest observed (a stall is judged against what it really takes)."""
    if len(observed_s) < LEARN_AFTER:
        return declared_s
    return max(observed_s)


def offer_of(
    deployment: Deployment,
    turnaround_s: float | None = None,
    measured_rows_per_s: float | None = None,
) -> LaneOffer:
    """The lane ``deployment`` offers (``turnaround_s``: a batch deployment's learned
    turnaround; ``measured_rows_per_s``: a fast one's measured throughput)."""
    price = deployment.price
    prompt = 0.0 if price is None else price.prompt_per_mtok
    completion = 0.0 if price is None else price.completion_per_mtok
    if deployment.batch is not None:
        declared = deployment.batch.turnaround.total_seconds()
        return LaneOffer(
            "batch", deployment.name, prompt, completion,
            expected_turnaround_s=declared if turnaround_s is None else turnaround_s,
            priced=price is not None,
        )  # fmt: skip
    rpm_rate = (
        None if deployment.limit is None or not deployment.limit.rpm else deployment.limit.rpm / 60
    )
    rate = measured_rows_per_s or deployment.rows_per_s or rpm_rate
    if rate is not None and rpm_rate is not None:
        rate = min(rate, rpm_rate)  # no faster than its rate limit lets it
    return LaneOffer(
        deployment.lane, deployment.name, prompt, completion, rows_per_s=rate,
        priced=price is not None,
    )  # fmt: skip


def offers_for(
    aliases: AliasTable,
    alias: str,
    turnarounds_s: Mapping[str, float] | None = None,
    measured_by_lane: Mapping[str, float] | None = None,
) -> list[LaneOffer]:
    """Every lane ``alias`` offers, in its deployments' order (empty for an unknown
    alias): ``turnarounds_s`` by batch deployment, ``measured_by_lane`` the flex and
    realtime lanes' measured rows a second (given to the first deployment of each)."""
    turnarounds_s = turnarounds_s or {}
    measured = dict(measured_by_lane or {})
    offers = []
    for d in aliases.resolve(alias) or ():
        offers.append(offer_of(d, turnarounds_s.get(d.name), measured.pop(d.lane, None)))
    return offers
