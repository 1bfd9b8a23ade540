-- Operating a running batch: pause, retry of failed rows, cost and budget, a job's
-- recent rate, per-row latency and cost, webhook retries and the delivery log.
--
-- Every column is nullable or has a constant default, so adding it rewrites and scans
-- nothing; the status CHECKs are added NOT VALID (new and updated rows are checked at
-- once) and validated in 0016, a transaction of its own under weaker locks.

ALTER TABLE batches ADD COLUMN IF NOT EXISTS retry_of text;
ALTER TABLE batches ADD COLUMN IF NOT EXISTS retries text[] NOT NULL DEFAULT '{}';
ALTER TABLE batches ADD COLUMN IF NOT EXISTS cost_usd double precision NOT NULL DEFAULT 0;
ALTER TABLE batches ADD COLUMN IF NOT EXISTS budget_usd double precision;
ALTER TABLE batches ADD COLUMN IF NOT EXISTS budget_exceeded_at timestamptz;
-- The aggregator's rate window: rows done at rate_window_at, and the rate measured over
-- the last window that closed (model.recent_rate reads them).
ALTER TABLE batches ADD COLUMN IF NOT EXISTS rate_rows_per_s double precision;
ALTER TABLE batches ADD COLUMN IF NOT EXISTS rate_window_at timestamptz;
ALTER TABLE batches ADD COLUMN IF NOT EXISTS rate_window_done integer NOT NULL DEFAULT 0;

ALTER TABLE batches DROP CONSTRAINT IF EXISTS batches_status_check;
ALTER TABLE batches ADD CONSTRAINT batches_status_check
    CHECK (status IN ('queued', 'scheduled', 'running', 'paused', 'completed', 'failed',
                      'canceled', 'expired'))
    NOT VALID;

INSERT INTO job_status_transitions (from_status, to_status) VALUES
    ('queued', 'paused'), ('running', 'paused'),
    ('paused', 'queued'), ('paused', 'completed'), ('paused', 'failed'),
    ('paused', 'canceled'), ('paused', 'expired')
ON CONFLICT DO NOTHING;

ALTER TABLE row_results ADD COLUMN IF NOT EXISTS latency_ms integer;
ALTER TABLE row_results ADD COLUMN IF NOT EXISTS cost_usd double precision;

-- A delivery's attempts so far, when the next one is due (retrying), and until when
-- automatic retries may go on (24 h after the first attempt; a redelivery asked for
-- through the API sets it to its own time: it is one attempt).
ALTER TABLE webhook_deliveries ADD COLUMN IF NOT EXISTS attempts integer NOT NULL DEFAULT 0;
ALTER TABLE webhook_deliveries ADD COLUMN IF NOT EXISTS next_attempt_at timestamptz;
ALTER TABLE webhook_deliveries ADD COLUMN IF NOT EXISTS retry_until timestamptz;
-- A redelivery asked for through the API (its attempts are logged as such and never
-- retried), and the claims made before the delivery's current attempt was armed: the
-- takeovers of one attempt are counted from there (claims - claims_before), so a
-- delivery retried many times is not given up for the claims of its earlier attempts.
ALTER TABLE webhook_deliveries ADD COLUMN IF NOT EXISTS redelivery boolean NOT NULL DEFAULT false;
ALTER TABLE webhook_deliveries ADD COLUMN IF NOT EXISTS claims_before integer NOT NULL DEFAULT 0;

ALTER TABLE webhook_deliveries DROP CONSTRAINT IF EXISTS webhook_deliveries_status_check;
ALTER TABLE webhook_deliveries ADD CONSTRAINT webhook_deliveries_status_check
    CHECK (status IN ('sending', 'posting', 'delivered', 'refused', 'failed', 'unknown',
                      'retrying'))
    NOT VALID;

INSERT INTO delivery_status_transitions (from_status, to_status) VALUES
    ('posting', 'retrying'),
    ('delivered', 'retrying'), ('refused', 'retrying'), ('failed', 'retrying'),
    ('unknown', 'retrying'),
    ('retrying', 'sending'), ('retrying', 'failed')
ON CONFLICT DO NOTHING;

-- The delivery log: one row per POST, written ``posting`` when the POST starts (in the
-- statement that marks the delivery posting) and finished with how it went.
CREATE TABLE IF NOT EXISTS webhook_attempts (
    batch_id         text NOT NULL,
    attempt          integer NOT NULL,
    status           text NOT NULL,
    response_status  integer,
    error            text,
    attempted_at     timestamptz NOT NULL DEFAULT now(),
    duration_ms      integer,
    redelivery       boolean NOT NULL DEFAULT false,
    PRIMARY KEY (batch_id, attempt)
);

-- How many attempts a workspace's completion webhooks get (1: the seed's rule, once).
ALTER TABLE workspaces ADD COLUMN IF NOT EXISTS webhook_max_attempts integer NOT NULL DEFAULT 1;
-- `relay workspaces webhook-retries` sets 1..20 (validated in 0016).
ALTER TABLE workspaces DROP CONSTRAINT IF EXISTS workspaces_webhook_max_attempts_check;
ALTER TABLE workspaces ADD CONSTRAINT workspaces_webhook_max_attempts_check
    CHECK (webhook_max_attempts BETWEEN 1 AND 20) NOT VALID;
