-- The scans 0015 leaves out of its exclusive locks: the status CHECKs' validation
-- (SHARE UPDATE EXCLUSIVE: reads and writes go on) and the indexes that name the new
-- statuses (SHARE: reads go on, writes wait for the build, about a second per million
-- rows). No-ops where done before.

ALTER TABLE batches VALIDATE CONSTRAINT batches_status_check;
ALTER TABLE webhook_deliveries VALIDATE CONSTRAINT webhook_deliveries_status_check;

-- The reaper's scan, paused jobs included (they expire too); 0017 drops the old one.
CREATE INDEX IF NOT EXISTS batches_expiring_live
    ON batches (expires_at) WHERE expires_at IS NOT NULL
        AND status IN ('queued', 'running', 'paused');

-- Deliveries whose next automatic attempt (or an asked-for redelivery) is due.
CREATE INDEX IF NOT EXISTS webhook_deliveries_retrying
    ON webhook_deliveries (next_attempt_at) WHERE status = 'retrying';

-- The range of workspaces.webhook_max_attempts (0015).
ALTER TABLE workspaces VALIDATE CONSTRAINT workspaces_webhook_max_attempts_check;
