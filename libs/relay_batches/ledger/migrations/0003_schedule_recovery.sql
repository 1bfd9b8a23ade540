-- Cron runs and crash recovery.
--
-- A run of a cron template records the tick it was spawned for; (template_id, tick) is
-- unique, so several schedulers can never spawn the same tick twice. Templates due
-- are found through a partial index on next_run_at.
--
-- A webhook claim carries an expiry: a claim still 'sending' after it expired belongs
-- to a notifier that died between claiming and recording, and may be taken over.

ALTER TABLE batches ADD COLUMN IF NOT EXISTS tick timestamptz;

CREATE UNIQUE INDEX IF NOT EXISTS batches_template_tick ON batches (template_id, tick);

CREATE INDEX IF NOT EXISTS batches_due_templates
    ON batches (next_run_at) WHERE status = 'scheduled';

ALTER TABLE webhook_deliveries ADD COLUMN IF NOT EXISTS claim_expires_at timestamptz;
ALTER TABLE webhook_deliveries ADD COLUMN IF NOT EXISTS claims integer NOT NULL DEFAULT 1;

CREATE INDEX IF NOT EXISTS webhook_deliveries_sending
    ON webhook_deliveries (claim_expires_at) WHERE status = 'sending';
