"""The lane plan of a job its dispatcher claims (see :mod:`relay_batches.lanes.plan`):
whether it starts in its alias's batch lane (offloaded) or in the fast lanes, chosen
by cost within its completion window and budget, and recorded on the job
(``batches.lane_plan``) so the API and the estimate can show it.

A job's tokens are estimated from the request sizes of its first :data:`SAMPLE_ROWS` rows
(about 4 bytes a token, as many completion tokens as prompt tokens, as the budget's first
estimate does).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict
from datetime import UTC, datetime

import asyncpg
import orjson

from relay_batches.lanes.offers import learned_turnaround, offers_for
from relay_batches.lanes.plan import LanePlan, choose_plan
from relay_batches.ledger.dispatch import RunningJob
from relay_batches.ledger.lane_rates import measured_rates
from relay_batches.ledger.offload.moving import LEARNED_FROM
from relay_batches.ledger.pool import translated
from relay_batches.router.aliases import AliasTable

log = logging.getLogger("relay.dispatcher")

TOKEN_BYTES = 4
SAMPLE_ROWS = 1000  # rows whose request sizes stand for the job's (a bounded read)


def plan_json(plan: LanePlan) -> str:
    """The plan as ``batches.lane_plan`` holds it."""
    return orjson.dumps(
        {
            "steps": [asdict(step) for step in plan.steps],
            "expected_finish_s": plan.expected_finish_s,
            "cost_usd": plan.cost_usd,
            "fits": plan.fits,
            "reason": plan.reason,
        }
    ).decode()


class LanePlanner:
    """Plans a claimed job's lanes on the ledger's pool and the routes' aliases."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        aliases: AliasTable,
        wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._pool = pool
        self._aliases = aliases
        self._wall_clock = wall_clock

    async def __call__(self, job: RunningJob) -> str | None:
        """The batch deployment to offload ``job`` to, or None when it starts in the
        fast lanes; its plan is recorded on the job. A job whose alias offers no batch
        lane, or one that began realtime, is not planned."""
        lead = self._aliases.batch_lead(job.model)
        if lead is None or lead.batch is None or job.dispatched_upto > 0:
            return None
        async with translated(), self._pool.acquire() as conn:
            mean = await conn.fetchval(
                "SELECT COALESCE(avg(octet_length(request)), 0)::float8 FROM (SELECT request"
                " FROM batch_rows WHERE batch_id = $1 ORDER BY row_index LIMIT $2) r",
                job.rows_batch_id,
                SAMPLE_ROWS,
            )
            observed = await conn.fetch(
                "SELECT extract(epoch FROM ended_at - submitted_at)::float8"
                " FROM offload_batches WHERE deployment = $1 AND state = 'settled'"
                " AND moved_at IS NULL AND error IS NULL AND submitted_at IS NOT NULL"
                " ORDER BY ended_at DESC LIMIT $2",
                lead.name,
                LEARNED_FROM,
            )
            declared = lead.batch.turnaround.total_seconds()
            turnaround = learned_turnaround(declared, [r[0] for r in observed])
            measured = await measured_rates(self._pool, [job.model])
            offers = offers_for(self._aliases, job.model, {lead.name: turnaround}, measured)
            tokens = int(mean * job.total) // TOKEN_BYTES + job.total
            window_s = (
                None
                if job.expires_at is None
                else (job.expires_at - self._wall_clock()).total_seconds()
            )
            plan = choose_plan(job.total, tokens, tokens, window_s, job.budget_usd, offers)
            await conn.execute(
                "UPDATE batches SET lane_plan = $2::jsonb WHERE id = $1", job.id, plan_json(plan)
            )
        log.info(
            "job_planned",
            extra={"batch_id": job.id, "plan": plan.describe(), "reason": plan.reason},
        )
        return plan.steps[0].deployment if plan.first_lane == "batch" else None
