"""The lane plan: the cheapest lanes that meet the window, with the batch lane's
insurance, the flex lane's refusals and the budget."""

from __future__ import annotations

import math

from relay_batches.lanes.plan import (
    LaneOffer,
    choose_plan,
    fast_finish_s,
    must_move,
    stall_after_s,
)

BATCH = LaneOffer("batch", "sim-batch", 0.075, 0.30, expected_turnaround_s=600)
FLEX = LaneOffer("flex", "sim-flex", 0.075, 0.30, rows_per_s=50, refusal_share=0.2)
REALTIME = LaneOffer("realtime", "sim-rt", 0.15, 0.60, rows_per_s=100)
ALL = [REALTIME, FLEX, BATCH]
ROWS, PROMPT, COMPLETION = 20_000, 2_000_000, 1_000_000


def realtime_cost() -> float:
    return REALTIME.cost_usd(PROMPT, COMPLETION)


def test_a_window_the_batch_lane_fits_takes_it_at_about_half_the_price() -> None:
    plan = choose_plan(ROWS, PROMPT, COMPLETION, 24 * 3600, None, ALL)
    assert [s.lane for s in plan.steps] == ["batch"]
    assert plan.steps[0].rows == ROWS and plan.fits
    assert math.isclose(plan.cost_usd, realtime_cost() / 2)
    assert plan.expected_finish_s == 600
    assert plan.cost_by_lane == {"batch": plan.cost_usd}


def test_no_deadline_takes_the_cheapest_lane() -> None:
    plan = choose_plan(ROWS, PROMPT, COMPLETION, None, None, ALL)
    assert plan.first_lane == "batch"


def test_the_batch_lane_needs_room_for_its_insurance() -> None:
    # 600 s turnaround: stalled at 900 s; the fast lanes answer 20,000 rows in 133 s
    # (150 rows/s), 190 s with the slack: a window under ~1,090 s cannot take the batch.
    rescue = stall_after_s(600) + fast_finish_s(ROWS, [FLEX, REALTIME]) / 0.7
    assert choose_plan(ROWS, PROMPT, COMPLETION, rescue + 1, None, ALL).first_lane == "batch"
    plan = choose_plan(ROWS, PROMPT, COMPLETION, rescue - 1, None, ALL)
    assert plan.first_lane == "flex"
    assert plan.fits


def test_too_short_a_window_goes_flex_first_and_realtime_for_its_refusals() -> None:
    plan = choose_plan(ROWS, PROMPT, COMPLETION, 300, None, ALL)
    lanes = {s.lane: s.rows for s in plan.steps}
    assert list(lanes) == ["flex", "realtime"]
    assert lanes["flex"] == 12_000  # 50 rows/s for 300 s, 20% of them refused
    assert lanes["flex"] + lanes["realtime"] == ROWS
    assert plan.fits and plan.expected_finish_s <= 300
    assert realtime_cost() / 2 < plan.cost_usd < realtime_cost()


def test_a_window_no_plan_meets_returns_the_fastest_and_says_so() -> None:
    plan = choose_plan(ROWS, PROMPT, COMPLETION, 10, None, ALL)
    assert not plan.fits
    assert "no plan meets the window" in plan.reason
    assert sum(s.rows for s in plan.steps) == ROWS


def test_a_budget_holds_across_lanes() -> None:
    half = realtime_cost() / 2
    within = choose_plan(ROWS, PROMPT, COMPLETION, 24 * 3600, half * 1.01, ALL)
    assert within.first_lane == "batch" and within.fits
    short = choose_plan(ROWS, PROMPT, COMPLETION, 300, half * 1.01, ALL)
    assert not short.fits and "budget" in short.reason


def test_realtime_only_alias_and_no_rows() -> None:
    plan = choose_plan(ROWS, PROMPT, COMPLETION, 24 * 3600, None, [REALTIME])
    assert [s.lane for s in plan.steps] == ["realtime"]
    assert math.isclose(plan.cost_usd, realtime_cost())
    assert choose_plan(0, 0, 0, None, None, ALL).steps == ()


def test_only_a_batch_lane_takes_it_even_when_it_does_not_fit() -> None:
    plan = choose_plan(ROWS, PROMPT, COMPLETION, 60, None, [BATCH])
    assert plan.first_lane == "batch" and not plan.fits


def test_cached_prompt_tokens_are_priced_at_the_cached_rate() -> None:
    cached = LaneOffer("realtime", "c", 1.0, 0.0, cached_input_usd_per_mtok=0.1)
    assert math.isclose(cached.cost_usd(1_000_000, 0, 500_000), 0.55)
    plain = LaneOffer("realtime", "p", 1.0, 0.0)
    assert math.isclose(plain.cost_usd(1_000_000, 0, 500_000), 1.0)


def test_the_ramp_moves_rows_when_the_fast_lanes_only_just_finish_them() -> None:
    fast = [FLEX, REALTIME]  # 150 rows/s
    assert not must_move(15_000, 1000, fast)  # 100 s of 1000
    assert must_move(15_000, 140, fast)  # 100 s of 140: past the slack
    assert not must_move(0, 1, fast)
    assert must_move(1, 10, [BATCH])  # no fast lane: never finishes


def test_an_unpriced_lane_leaves_the_choice_to_the_lanes_order() -> None:
    free = LaneOffer("realtime", "sim", 0.0, 0.0, rows_per_s=100, priced=False)
    plan = choose_plan(ROWS, PROMPT, COMPLETION, None, None, [free, BATCH])
    assert plan.first_lane == "batch"
    short = choose_plan(ROWS, PROMPT, COMPLETION, 300, None, [free, BATCH])
    assert short.first_lane == "realtime"
