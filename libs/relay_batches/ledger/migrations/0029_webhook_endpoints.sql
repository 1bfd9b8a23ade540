-- A workspace's webhook endpoints (OpenAI's project webhooks): every batch of the
-- workspace that ends sends an event to each endpoint whose events name its type.
-- The secret is kept to sign with (the workspace's own webhook_secret is too, 0004); it
-- is shown once, in the answer to the POST that created the endpoint.
CREATE TABLE IF NOT EXISTS webhook_endpoints (
    id            text PRIMARY KEY CHECK (id ~ '^[0-9a-f]{32}$'),
    workspace_id  text NOT NULL REFERENCES workspaces (id),
    url           text NOT NULL,
    events        text[] NOT NULL,
    secret        text NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX IF NOT EXISTS webhook_endpoints_workspace
    ON webhook_endpoints (workspace_id, created_at, id);

-- The surface a batch was created on when its id shows otherwise there: 'anthropic'
-- (msgbatch_…). NULL for the others: a batch of the OpenAI surface is known by its
-- openai_batches link (batch_…), any other shows its own id. Nullable: nothing rewritten.
ALTER TABLE batches ADD COLUMN IF NOT EXISTS surface text;

-- A batch's deliveries: its own completion webhook (endpoint_id '') and one event per
-- webhook endpoint that matched when it ended, whose event body (an OpenAI event) is
-- fixed when the delivery is recorded so every attempt sends the same bytes and
-- webhook-id. Constant defaults: the columns rewrite and scan nothing.
--
-- Each primary key becomes (batch_id, endpoint_id[, attempt]). The new key's index is
-- built first, under the SHARE lock of CREATE INDEX (readers go on; writes wait for the
-- build, as for every index these migrations build; no CONCURRENTLY inside a
-- transaction); only then is the old key dropped and the index made the key, a change of
-- the catalog alone (no scan: the columns are NOT NULL already) under a moment's ACCESS
-- EXCLUSIVE lock right before the commit. A reader waits for that moment, never for the
-- build.
ALTER TABLE webhook_deliveries ADD COLUMN IF NOT EXISTS endpoint_id text NOT NULL DEFAULT '';
ALTER TABLE webhook_deliveries ADD COLUMN IF NOT EXISTS body text;
ALTER TABLE webhook_attempts ADD COLUMN IF NOT EXISTS endpoint_id text NOT NULL DEFAULT '';

CREATE UNIQUE INDEX IF NOT EXISTS webhook_deliveries_endpoint_key
    ON webhook_deliveries (batch_id, endpoint_id);
CREATE UNIQUE INDEX IF NOT EXISTS webhook_attempts_endpoint_key
    ON webhook_attempts (batch_id, endpoint_id, attempt);

ALTER TABLE webhook_deliveries DROP CONSTRAINT IF EXISTS webhook_deliveries_pkey,
    ADD CONSTRAINT webhook_deliveries_pkey PRIMARY KEY USING INDEX webhook_deliveries_endpoint_key;
ALTER TABLE webhook_attempts DROP CONSTRAINT IF EXISTS webhook_attempts_pkey,
    ADD CONSTRAINT webhook_attempts_pkey PRIMARY KEY USING INDEX webhook_attempts_endpoint_key;
