"""The lane plan: which lanes a job's rows start in so that it meets its deadline at the
lowest price (a pure function, no I/O: the dispatcher and the estimate both call it).

An alias may offer three lanes (see :mod:`relay_batches.lanes`):

- ``batch``: a provider's batch API, the cheapest; every row answered at once after an
  *expected turnaround* (declared by its deployment, then learned from finished
  batches), with no throughput limit of its own (big jobs are split by the provider's
  caps and their batches run side by side).
- ``flex``: a synchronous call at (about) the batch price that the provider may refuse
  when capacity is short; ``rows_per_s`` is its measured throughput and
  ``refusal_share`` the part of its rows expected to be refused (they go realtime).
- ``realtime``: today's calls, at full price, at the alias's measured throughput under
  its rate limits.

:func:`choose_plan` takes the cheapest lane whose expected finish fits the window; the
batch lane fits only when, should the provider's batch stall, the faster lanes could
still answer every row before the deadline after the batch was declared stalled
(:data:`STALL_FACTOR` times its expected turnaround): that is the *insurance*. Without
a batch lane that fits, rows go to the flex lane as far as it can answer them within
the window (its refusals realtime), the rest realtime. :func:`must_move` is the ramp's
test: whether rows still unanswered in the batch lane must move now to finish in time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

Lane = Literal["batch", "flex", "realtime"]
LANES: tuple[Lane, ...] = ("batch", "flex", "realtime")
TOKENS_PER_MTOK = 1_000_000
# A batch with no progress this many times its expected turnaround is stalled.
STALL_FACTOR = 1.5
# The ramp moves rows when the fast lanes need this share of the time left (the rest is
# slack for estimates that were too kind: a slower realtime, more flex refusals).
RAMP_SLACK = 0.7


@dataclass(frozen=True)
class LaneOffer:
    """One lane an alias offers: its deployment, its price (USD per million tokens) and
    how fast it answers (``expected_turnaround_s`` for the batch lane, ``rows_per_s``
    for flex and realtime; None: unknown, not counted on while another fast lane's rate
    is known, unlimited otherwise)."""

    lane: Lane
    deployment: str
    input_usd_per_mtok: float
    output_usd_per_mtok: float
    cached_input_usd_per_mtok: float | None = None
    expected_turnaround_s: float | None = None
    rows_per_s: float | None = None
    refusal_share: float = 0.0  # flex: the share of its rows expected refused
    priced: bool = True  # False: its deployment has no price (its prices above are 0)

    def cost_usd(self, prompt_tokens: float, completion_tokens: float, cached: float = 0) -> float:
        """The cost of tokens answered in this lane (``cached`` of the prompt tokens at
        the cached rate, when the lane has one)."""
        cached_rate = self.cached_input_usd_per_mtok
        if cached_rate is None:
            cached_rate, cached = self.input_usd_per_mtok, 0
        return (
            (prompt_tokens - cached) * self.input_usd_per_mtok
            + cached * cached_rate
            + completion_tokens * self.output_usd_per_mtok
        ) / TOKENS_PER_MTOK


@dataclass(frozen=True)
class PlanStep:
    """Rows a plan sends to one lane's deployment, what they are expected to cost, and
    when (seconds after the start) they are expected answered."""

    lane: Lane
    deployment: str
    rows: int
    cost_usd: float
    finish_s: float


@dataclass(frozen=True)
class LanePlan:
    """The plan for a job: its steps (the lanes its rows are expected to be answered
    in), its expected finish (seconds after the start), its expected cost, whether it
    meets the window and the budget (``fits``), and why it was chosen."""

    steps: tuple[PlanStep, ...]
    expected_finish_s: float
    cost_usd: float
    fits: bool = True
    reason: str = ""
    cost_by_lane: Mapping[str, float] = field(default_factory=dict)

    @property
    def first_lane(self) -> Lane:
        """The lane the job starts in (realtime for an empty plan)."""
        return self.steps[0].lane if self.steps else "realtime"

    def describe(self) -> str:
        """One line: ``batch 20000 rows (openai-batch) ; expected 600s, 1.23 USD``."""
        parts = [f"{s.lane} {s.rows} rows ({s.deployment})" for s in self.steps]
        return (
            f"{' + '.join(parts) or 'nothing'}; expected {self.expected_finish_s:.0f}s,"
            f" {self.cost_usd:.4f} USD"
        )


def choose_plan(
    rows: int,
    prompt_tokens: int,
    completion_tokens: int,
    window_s: float | None,
    budget_usd: float | None,
    offers: Sequence[LaneOffer],
    cached_prompt_tokens: int = 0,
) -> LanePlan:
    """The cheapest plan for ``rows`` rows of ``prompt_tokens`` and ``completion_tokens``
    in all (estimated; ``cached_prompt_tokens`` of the prompt tokens expected read from
    the provider's cache) that finishes within ``window_s`` (None: no deadline) on the
    lanes ``offers`` (any order; at most one per lane is used, the cheapest). A plan over
    ``budget_usd`` or past the window is still returned, the fastest one, with
    ``fits=False``: the job runs it and the budget stops it as any job. When a lane has
    no price, the plans that fit are ranked by their first lane (batch, flex, realtime)
    instead of by cost."""
    by_lane = _cheapest_per_lane(offers, prompt_tokens, completion_tokens)
    if rows <= 0 or not by_lane:
        return LanePlan((), 0.0, 0.0, True, "no rows" if rows <= 0 else "no lane")
    share = _Share(rows, prompt_tokens, completion_tokens, cached_prompt_tokens)
    batch = by_lane.get("batch")
    fast = [o for o in (by_lane.get("flex"), by_lane.get("realtime")) if o is not None]
    candidates: list[LanePlan] = []
    if batch is not None:
        plan = _batch_plan(batch, fast, share, window_s)
        if plan is not None:
            candidates.append(plan)
    if fast:
        candidates.append(_fast_plan(fast, share, window_s))
    fitting = [p for p in candidates if p.fits]
    within = [p for p in fitting if budget_usd is None or p.cost_usd <= budget_usd * (1 + 1e-9)]
    if within and not all(o.priced for o in by_lane.values()):
        # A lane without a price cannot be compared: the lanes' order decides (batch first).
        return min(within, key=lambda p: (LANES.index(p.first_lane), p.expected_finish_s))
    if within:
        return min(within, key=lambda p: (p.cost_usd, p.expected_finish_s))
    if fitting:
        best = min(fitting, key=lambda p: p.cost_usd)
        return _refit(best, False, f"{best.reason}; over the budget of {budget_usd} USD")
    if not candidates:  # only a batch lane, and it cannot meet the window
        assert batch is not None
        steps = (_step(batch, share, rows, batch.expected_turnaround_s or 0.0),)
        return _plan(steps, False, "only the batch lane, and it does not fit the window")
    best = min(candidates, key=lambda p: p.expected_finish_s)
    return _refit(best, False, f"{best.reason}; no plan meets the window of {window_s}s")


def fast_rate(offers: Sequence[LaneOffer]) -> float:
    """Rows a second the fast lanes (flex and realtime) answer together, counting only
    those whose rate is known; ``inf`` when none is known, 0 when there is no fast lane."""
    rates = [o.rows_per_s for o in offers if o.lane != "batch"]
    if not rates:
        return 0.0
    known = [r for r in rates if r is not None]
    return sum(known) if known else math.inf


def fast_finish_s(rows: int, offers: Sequence[LaneOffer]) -> float:
    """Seconds the fast lanes need to answer ``rows`` rows side by side (``inf`` when
    there is no fast lane)."""
    if rows <= 0:
        return 0.0
    rate = fast_rate(offers)
    if rate <= 0:
        return math.inf
    return rows / rate


def must_move(
    rows_left: int, seconds_left: float, offers: Sequence[LaneOffer], slack: float = RAMP_SLACK
) -> bool:
    """The ramp's test: whether ``rows_left`` rows still unanswered in the batch lane
    must move to the fast lanes now, because answering them there would take at least
    ``slack`` of the ``seconds_left`` before the deadline."""
    if rows_left <= 0:
        return False
    return fast_finish_s(rows_left, offers) >= slack * seconds_left


def stall_after_s(expected_turnaround_s: float, factor: float = STALL_FACTOR) -> float:
    """Seconds without progress after which a provider batch is taken as stalled."""
    return expected_turnaround_s * factor


@dataclass(frozen=True)
class _Share:
    """A job's rows and tokens, split between lanes in proportion to rows."""

    rows: int
    prompt: int
    completion: int
    cached: int

    def cost(self, offer: LaneOffer, rows: int) -> float:
        part = rows / self.rows
        return offer.cost_usd(self.prompt * part, self.completion * part, self.cached * part)


def _cheapest_per_lane(
    offers: Sequence[LaneOffer], prompt: int, completion: int
) -> dict[Lane, LaneOffer]:
    found: dict[Lane, LaneOffer] = {}
    for offer in offers:
        held = found.get(offer.lane)
        cost = offer.cost_usd(max(1, prompt), max(1, completion))
        if held is None or cost < held.cost_usd(max(1, prompt), max(1, completion)):
            found[offer.lane] = offer
    return found


def _batch_plan(
    batch: LaneOffer, fast: Sequence[LaneOffer], share: _Share, window_s: float | None
) -> LanePlan | None:
    """Every row in the batch lane, when it fits the window with its insurance: the fast
    lanes must still answer every row between the stall's discovery and the deadline."""
    turnaround = batch.expected_turnaround_s or 0.0
    steps = (_step(batch, share, share.rows, turnaround),)
    if window_s is None:
        return _plan(steps, True, "no deadline: the cheapest lane")
    if not fast:
        fits = turnaround <= window_s
        return _plan(steps, fits, "the batch lane fits the window (no faster lane)")
    rescue = stall_after_s(turnaround) + fast_finish_s(share.rows, fast) / RAMP_SLACK
    if rescue > window_s:
        return None
    return _plan(steps, True, "the batch lane fits the window, a stall included")


def _fast_plan(fast: Sequence[LaneOffer], share: _Share, window_s: float | None) -> LanePlan:
    """Rows to the cheaper fast lane as far as it answers them within the window (its
    refusals to the next), the rest to the next one."""
    ordered = sorted(fast, key=lambda o: share.cost(o, share.rows))
    left = share.rows
    steps: list[PlanStep] = []
    spill = 0  # rows a lane is expected to refuse, for the next lane
    for position, offer in enumerate(ordered):
        last = position == len(ordered) - 1
        take = left
        if not last and window_s is not None and offer.rows_per_s is not None:
            take = min(left, math.floor(offer.rows_per_s * window_s))
        refused = math.floor(take * offer.refusal_share) if not last else 0
        answered = take - refused
        if answered > 0:
            finish = _rate_time(answered, offer.rows_per_s)
            steps.append(_step(offer, share, answered, finish))
        left = left - take + refused
        spill += refused
        if left <= 0:
            break
    if left > 0 and steps:  # nothing could take them: the last lane does
        last_step = steps[-1]
        offer = ordered[-1]
        rows = last_step.rows + left
        steps[-1] = _step(offer, share, rows, _rate_time(rows, offer.rows_per_s))
    finish = max(s.finish_s for s in steps)
    fits = window_s is None or finish <= window_s
    lanes = " then ".join(s.lane for s in steps)
    return _plan(tuple(steps), fits, f"the batch lane does not fit: {lanes}")


def _rate_time(rows: int, rate: float | None) -> float:
    return 0.0 if rate is None or rate <= 0 else rows / rate


def _step(offer: LaneOffer, share: _Share, rows: int, finish_s: float) -> PlanStep:
    return PlanStep(offer.lane, offer.deployment, rows, share.cost(offer, rows), finish_s)


def _plan(steps: tuple[PlanStep, ...], fits: bool, reason: str) -> LanePlan:
    by_lane: dict[str, float] = {}
    for step in steps:
        by_lane[step.lane] = by_lane.get(step.lane, 0.0) + step.cost_usd
    return LanePlan(
        steps,
        max((s.finish_s for s in steps), default=0.0),
        sum(s.cost_usd for s in steps),
        fits,
        reason,
        by_lane,
    )


def _refit(plan: LanePlan, fits: bool, reason: str) -> LanePlan:
    return LanePlan(
        plan.steps, plan.expected_finish_s, plan.cost_usd, fits, reason, plan.cost_by_lane
    )
