-- The scans 0015 leaves out of its exclusive locks: the status CHECKs' validation
-- (SHARE UPDATE EXCLUSIVE: reads and writes go on) and the indexes that name the new
-- statuses (SHARE: reads go on, writes wait for the build, about a second per million
-- rows). No-ops where done before. The batches indexes are built last: their SHARE lock on
-- batches (every service writes there) then lasts only to the commit right after them.

ALTER TABLE batches VALIDATE CONSTRAINT batches_status_check;
ALTER TABLE webhook_deliveries VALIDATE CONSTRAINT webhook_deliveries_status_check;

-- The range of workspaces.webhook_max_attempts (0015).
ALTER TABLE workspaces VALIDATE CONSTRAINT workspaces_webhook_max_attempts_check;

-- Deliveries whose next automatic attempt (or an asked-for redelivery) is due.
CREATE INDEX IF NOT EXISTS webhook_deliveries_retrying
    ON webhook_deliveries (next_attempt_at) WHERE status = 'retrying';

-- The aggregator's budget settle: live jobs a budget stopped (few, and briefly: each is
-- settled within seconds and ends once its rows in flight are in).
CREATE INDEX IF NOT EXISTS batches_budget_stopped
    ON batches (budget_exceeded_at) WHERE budget_exceeded_at IS NOT NULL
        AND status IN ('queued', 'running', 'paused');

-- The reaper's scan, paused jobs included (they expire too); 0017 drops the old one.
CREATE INDEX IF NOT EXISTS batches_expiring_live
    ON batches (expires_at) WHERE expires_at IS NOT NULL
        AND status IN ('queued', 'running', 'paused');
