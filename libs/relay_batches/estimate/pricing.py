"""An estimate's prices: the cost of a counted job in each lane its alias offers, and of
the plan Relay would choose (:func:`relay_batches.lanes.plan.choose_plan`).

The lanes are the planner's own (:func:`relay_batches.lanes.offers.offers_for`: each
deployment's lane, price and speed, the fast lanes' measured throughput given by the
caller), keeping the first priced deployment of each lane: an unpriced deployment offers
nothing to estimate with.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from relay_batches.estimate.tally import Tally
from relay_batches.lanes.offers import offers_for
from relay_batches.lanes.plan import LaneOffer, LanePlan, choose_plan
from relay_batches.model import iso, shown
from relay_batches.router.aliases import AliasTable


def lane_offers(
    aliases: AliasTable, alias: str, measured_by_lane: Mapping[str, float] | None = None
) -> list[LaneOffer]:
    """The lanes ``alias`` offers, the first priced deployment of each, in its
    deployments' order (``measured_by_lane``: the fast lanes' measured rows a second)."""
    priced = {d.name for d in aliases.resolve(alias) or () if d.price is not None}
    offers: list[LaneOffer] = []
    for offer in offers_for(aliases, alias, None, measured_by_lane):
        if offer.deployment in priced and all(o.lane != offer.lane for o in offers):
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
    offers: Sequence[LaneOffer],
    window_s: float | None,
    budget_usd: float | None,
    now: datetime | None = None,
) -> Estimate:
    """Price ``tally`` in each lane ``offers`` (:func:`lane_offers`) and plan it within
    ``window_s`` and ``budget_usd`` (None: no limit)."""
    offers = tuple(offers)
    plan = choose_plan(
        tally.rows,
        tally.prompt_tokens,
        math.ceil(tally.completion_tokens),
        window_s,
        budget_usd,
        offers,
    )
    return Estimate(tally, offers, plan, now or datetime.now(UTC))
