"""An estimate's prices: the cost of a counted job in each lane its alias offers, and of
the plan Relay would choose (:func:`relay_batches.lanes.plan.choose_plan`).

The lanes come from the alias's deployments in the routes file (:func:`lane_offers`): its
batch deployment (a provider's batch API, expected to answer within its ``window``), and
its first priced realtime deployment (as fast as its ``rpm`` lets it, unlimited without
one). An unpriced deployment offers no lane: there is nothing to estimate with.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from relay_batches.estimate.tally import Tally
from relay_batches.lanes.plan import LaneOffer, LanePlan, choose_plan
from relay_batches.model import iso, shown
from relay_batches.router.aliases import Deployment

SECONDS_PER_MINUTE = 60.0


def _offer(lane: Any, deployment: Deployment) -> LaneOffer | None:
    price = deployment.price
    if price is None:
        return None
    batch = deployment.batch
    rpm = None if deployment.limit is None else deployment.limit.rpm
    return LaneOffer(
        lane=lane,
        deployment=deployment.name,
        input_usd_per_mtok=price.prompt_per_mtok,
        output_usd_per_mtok=price.completion_per_mtok,
        cached_input_usd_per_mtok=price.cached_prompt_per_mtok,
        expected_turnaround_s=None if batch is None else batch.window.total_seconds(),
        rows_per_s=None if rpm is None else rpm / SECONDS_PER_MINUTE,
    )


def lane_offers(deployments: Sequence[Deployment]) -> list[LaneOffer]:
    """The lanes an alias's deployments offer: its batch deployment's and its first
    priced realtime deployment's (each only when priced)."""
    offers: list[LaneOffer] = []
    batch = next((d for d in deployments if d.is_batch), None)
    realtime = next((d for d in deployments if not d.is_batch and d.price is not None), None)
    for lane, deployment in (("batch", batch), ("realtime", realtime)):
        offer = None if deployment is None else _offer(lane, deployment)
        if offer is not None:
            offers.append(offer)
    return offers


@dataclass(frozen=True)
class Estimate:
    """A counted job priced per lane and by its plan."""

    tally: Tally
    offers: tuple[LaneOffer, ...]
    plan: LanePlan
    now: datetime

    def to_api(self) -> dict[str, Any]:
        """The ``batch.estimate`` object of ``POST /v1/batches/estimate``."""
        tally, plan = self.tally, self.plan
        completion = math.ceil(tally.completion_tokens)
        finish = self.now + timedelta(seconds=plan.expected_finish_s)
        return {
            "object": "batch.estimate",
            "rows": tally.rows,
            "prompt_tokens": tally.prompt_tokens,
            "completion_tokens": completion,
            "completion_basis": tally.completion_basis,
            "lanes": [
                {
                    "lane": o.lane,
                    "deployment": o.deployment,
                    "cost_usd": shown(o.cost_usd(tally.prompt_tokens, completion)),
                }
                for o in self.offers
            ],
            "plan": {
                "steps": [
                    {
                        "lane": s.lane,
                        "deployment": s.deployment,
                        "rows": s.rows,
                        "cost_usd": shown(s.cost_usd),
                        "finish_s": round(s.finish_s, 1),
                    }
                    for s in plan.steps
                ],
                "cost_usd": shown(plan.cost_usd),
                "fits": plan.fits,
                "reason": plan.reason,
            },
            "cost_usd": shown(plan.cost_usd),
            "expected_finish_s": round(plan.expected_finish_s, 1),
            "expected_finish_at": iso(finish),
        }


def price_estimate(
    tally: Tally,
    deployments: Sequence[Deployment],
    window_s: float | None,
    budget_usd: float | None,
    now: datetime | None = None,
) -> Estimate:
    """Price ``tally`` in each lane of ``deployments`` and plan it within ``window_s``
    and ``budget_usd`` (None: no limit)."""
    offers = tuple(lane_offers(deployments))
    plan = choose_plan(
        tally.rows,
        tally.prompt_tokens,
        math.ceil(tally.completion_tokens),
        window_s,
        budget_usd,
        offers,
    )
    return Estimate(tally, offers, plan, now or datetime.now(UTC))
