-- When the aggregator last recorded an outcome of a job (only its recording sets it;
-- last_progress_at is also the stall clock, which dispatchers restart). Dispatchers read
-- the latest over running jobs once per reconcile pass as the evidence that the
-- aggregator records (stall recovery waits while it does not). A nullable column without
-- a default: adding it rewrites nothing.

ALTER TABLE batches ADD COLUMN IF NOT EXISTS recorded_at timestamptz;
