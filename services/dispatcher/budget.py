"""The budget bound on a release: a job with a budget releases only the rows its budget
left can pay for, at an estimated cost per row (a hard cap: the overshoot is the rows
started when the recorded cost reached the budget, not the rows released).

The estimate is the job's observed cost per answered row once it has one (its recorded
cost over its completed rows), and before that what the price of its alias's first
deployment makes of a row's request size (about :data:`TOKEN_BYTES` bytes a token, and
as many completion tokens as prompt tokens). Rows released whose cost is not recorded
yet count at that estimate. With nothing out, one row always goes, so the job reaches
its budget and stops (the aggregator's budget stop) rather than waiting forever.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from relay_batches.ledger.dispatch import RunningJob
from relay_batches.router.aliases import AliasTable, Price

TOKEN_BYTES = 4

# An alias's price (its first realtime deployment's), None when unpriced or unknown.
PriceOf = Callable[[str], Price | None]


def alias_price(aliases: AliasTable, alias: str) -> Price | None:
    """The price of the first realtime deployment of ``alias`` (where its rows go
    first), None when it has none or the alias is unknown."""
    for deployment in aliases.resolve(alias) or ():
        if not deployment.is_batch:
            return deployment.price
    return None


def row_estimate(request_bytes: int, price: Price) -> float:
    """A row's cost before it ran: its request's tokens (``request_bytes`` /
    :data:`TOKEN_BYTES`) as prompt and as many again as completion."""
    tokens = request_bytes // TOKEN_BYTES + 1
    return price.cost_usd(tokens, tokens)


def rows_within_budget(
    job: RunningJob, dispatched_upto: int, in_flight: int, sizes: Sequence[int], price: Price | None
) -> int:
    """How many of the next rows (their request sizes ``sizes``, in release order) the
    budget of ``job`` left may pay for, with ``in_flight`` of its rows out and without an
    outcome now (``job``'s counters and cost may be older); every one without a budget,
    or without a price and before any observed cost."""
    if job.budget_usd is None or not sizes:
        return len(sizes)
    observed = job.cost_usd / job.completed if job.completed > 0 else None
    if observed is None and price is None:
        return len(sizes)

    def estimate(size: int) -> float:
        if observed is not None:
            return observed
        assert price is not None
        return row_estimate(size, price)

    budget = job.budget_usd * (1 + 1e-9)  # sums of float costs: no row lost to rounding
    ahead = max(0, dispatched_upto - job.done)  # released, cost not recorded yet
    spent = job.cost_usd + ahead * estimate(sizes[0])
    allowed = 0
    for size in sizes:
        cost = estimate(size)
        if spent + cost > budget and (allowed > 0 or in_flight > 0):
            break
        spent += cost
        allowed += 1
    return allowed
