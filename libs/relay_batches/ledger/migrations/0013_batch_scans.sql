-- The scans of batches that 0010 leaves out of its exclusive locks. VALIDATE CONSTRAINT
-- takes SHARE UPDATE EXCLUSIVE: reads and writes go on while the existing rows are
-- checked. The indexes are not CONCURRENTLY because a migration runs in a transaction
-- (ledger/migrate.py) and CREATE INDEX CONCURRENTLY cannot; a plain CREATE INDEX takes
-- SHARE: reads go on, and writes to batches (claims, progress) wait for the builds, about
-- a second per million jobs. All are no-ops where an earlier 0010 did them.

ALTER TABLE batches VALIDATE CONSTRAINT batches_status_check;

-- The expiry scan: live jobs with a deadline, soonest first.
CREATE INDEX IF NOT EXISTS batches_expiring
    ON batches (expires_at) WHERE expires_at IS NOT NULL AND status IN ('queued', 'running');

-- The outbox scan of terminal jobs (aggregator), now with 'expired' among them.
CREATE INDEX IF NOT EXISTS batches_unpublished_end
    ON batches (completed_at) WHERE NOT finished_published
        AND status IN ('completed', 'failed', 'canceled', 'expired');
