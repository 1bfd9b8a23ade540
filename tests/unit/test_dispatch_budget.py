"""The budget bound on a release: before any observed cost a row's estimate is what its
alias's price makes of its request size; then the job's observed cost per answered row;
rows out without a recorded cost count at the estimate; one row always goes when none is
out, so the job reaches its budget."""

from __future__ import annotations

from dataclasses import replace

import pytest

from relay_batches.router.aliases import AliasTable, Deployment, Price
from relay_batches.services.dispatcher.budget import alias_price, row_estimate, rows_within_budget
from tests.helpers.fakes import job as job_of

PRICE = Price(1000.0, 2000.0)


def test_a_row_is_estimated_from_its_request_size_and_the_price() -> None:
    assert row_estimate(399, PRICE) == pytest.approx(100 * (1000 + 2000) / 1e6)


def test_without_a_budget_or_a_price_every_row_goes() -> None:
    job = job_of("j", total=200)
    assert rows_within_budget(job, 0, 0, [400] * 10, PRICE) == 10
    assert rows_within_budget(replace(job, budget_usd=0.01), 0, 0, [400] * 10, None) == 10


def test_before_any_cost_the_price_of_the_request_sizes_bounds_the_release() -> None:
    job = replace(job_of("j", total=200), budget_usd=20.5 * row_estimate(399, PRICE))
    assert rows_within_budget(job, 0, 0, [399] * 64, PRICE) == 20


def test_the_observed_cost_per_row_takes_over_and_counts_rows_out() -> None:
    job = replace(
        job_of("j", total=200, completed=10, dispatched_upto=10), budget_usd=1.0, cost_usd=0.5
    )
    # 0.05 a row observed: 10 rows left, of which 4 are out (released, cost unknown).
    assert rows_within_budget(job, 14, 4, [10] * 64, PRICE) == 6


def test_one_row_goes_when_none_is_out_even_past_the_estimate() -> None:
    job = replace(job_of("j", total=200, completed=10), budget_usd=1.0, cost_usd=0.99)
    assert rows_within_budget(job, 10, 0, [10] * 64, PRICE) == 1
    assert rows_within_budget(job, 11, 1, [10] * 64, PRICE) == 0


def test_an_alias_is_priced_by_its_first_realtime_deployment() -> None:
    realtime = Deployment("rt", "openai", "http://x", "m", price=PRICE)
    table = AliasTable({"a": (realtime,), "free": (replace(realtime, price=None),)})
    assert alias_price(table, "a") == PRICE
    assert alias_price(table, "free") is None
    assert alias_price(table, "unknown") is None
