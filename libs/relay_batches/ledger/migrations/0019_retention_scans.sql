-- The retention reaper's scan: ended jobs (canceled cron templates among them), oldest
-- end first. Its own file: the build holds a SHARE lock on batches (reads go on,
-- writes wait, about a second per million rows) only to the commit right after it.
-- The idempotency_keys index serves the purge of records past their 24 hours.

CREATE INDEX IF NOT EXISTS idempotency_keys_created ON idempotency_keys (created_at);

CREATE INDEX IF NOT EXISTS batches_ended
    ON batches (completed_at) WHERE status IN ('completed', 'failed', 'canceled', 'expired');
