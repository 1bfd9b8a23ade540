-- The scans of webhook_deliveries (which only grows) that 0006 leaves out of its
-- exclusive lock. VALIDATE CONSTRAINT takes SHARE UPDATE EXCLUSIVE: reads and writes go
-- on while the existing rows are checked. The indexes are not CONCURRENTLY because a
-- migration runs in a transaction (ledger/migrate.py) and CREATE INDEX CONCURRENTLY
-- cannot; a plain CREATE INDEX takes SHARE: reads go on, and writes (the notifier's
-- claims and records) wait for the build, about a second per million rows. Both are
-- no-ops where they were done before (an earlier 0006 validated and built them).

ALTER TABLE webhook_deliveries VALIDATE CONSTRAINT webhook_deliveries_status_check;

CREATE INDEX IF NOT EXISTS webhook_deliveries_posting
    ON webhook_deliveries (claim_expires_at) WHERE status = 'posting';

-- Deliveries deferred while their receiver was busy (or handed back by a takeover).
CREATE INDEX IF NOT EXISTS webhook_deliveries_deferred
    ON webhook_deliveries (created_at) WHERE status = 'sending' AND deferred;
