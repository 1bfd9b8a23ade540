-- Lanes (docs/guides/lanes.md): which lane answered each row, and what each lane cost a
-- job. Every column is nullable or has a constant default: adding it rewrites nothing.
--
-- row_results.lane: 'batch' (a provider's batch), 'flex' or 'realtime' for an answered
-- row; NULL for a failed row (and rows recorded before this migration).
ALTER TABLE row_results ADD COLUMN IF NOT EXISTS lane text;
-- batches.cost_<lane>_usd / rows_<lane>: the answered rows and their cost per lane, added
-- in the statement that records the rows (as cost_usd is; their sum is cost_usd for the
-- rows recorded after this migration).
ALTER TABLE batches ADD COLUMN IF NOT EXISTS cost_batch_usd double precision NOT NULL DEFAULT 0;
ALTER TABLE batches ADD COLUMN IF NOT EXISTS cost_flex_usd double precision NOT NULL DEFAULT 0;
ALTER TABLE batches ADD COLUMN IF NOT EXISTS cost_realtime_usd double precision NOT NULL DEFAULT 0;
ALTER TABLE batches ADD COLUMN IF NOT EXISTS rows_batch integer NOT NULL DEFAULT 0;
ALTER TABLE batches ADD COLUMN IF NOT EXISTS rows_flex integer NOT NULL DEFAULT 0;
ALTER TABLE batches ADD COLUMN IF NOT EXISTS rows_realtime integer NOT NULL DEFAULT 0;
-- batches.late_answers: answers a provider batch gave for rows already moved to another
-- lane (the ramp, a stalled batch): discarded, neither recorded nor charged.
ALTER TABLE batches ADD COLUMN IF NOT EXISTS late_answers integer NOT NULL DEFAULT 0;
-- batches.lane_plan: the plan its dispatcher chose when it claimed the job (lanes, rows,
-- expected cost and finish, why); NULL for a job no plan was made for.
ALTER TABLE batches ADD COLUMN IF NOT EXISTS lane_plan jsonb;
-- offload_batches.moved_at / moved_reason: when and why (stalled, ramp) its rows moved
-- to the fast lanes before it ended.
ALTER TABLE offload_batches ADD COLUMN IF NOT EXISTS moved_at timestamptz;
ALTER TABLE offload_batches ADD COLUMN IF NOT EXISTS moved_reason text;
-- offload_batches.progressed_at: when a poll last saw its provider batch progress (NULL:
-- never since its submit): a batch quiet beyond its expected turnaround is stalled.
ALTER TABLE offload_batches ADD COLUMN IF NOT EXISTS progressed_at timestamptz;
