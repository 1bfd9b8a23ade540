-- A cron template's completion window: each run it spawns expires that long after it is
-- spawned (batches.expires_at of the run). NULL: its runs have no deadline. One-off
-- jobs keep the column too (informational); only the scheduler reads it. Adding a
-- nullable column scans nothing.

ALTER TABLE batches ADD COLUMN IF NOT EXISTS completion_window interval;
