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
-- webhook-id. Constant defaults: no rewrite. Each primary key is rebuilt with the
-- endpoint in it (an index build under the table's lock: one row per batch and
-- endpoint, or per attempt).
ALTER TABLE webhook_deliveries ADD COLUMN IF NOT EXISTS endpoint_id text NOT NULL DEFAULT '';
ALTER TABLE webhook_deliveries ADD COLUMN IF NOT EXISTS body text;
ALTER TABLE webhook_deliveries DROP CONSTRAINT IF EXISTS webhook_deliveries_pkey;
ALTER TABLE webhook_deliveries ADD CONSTRAINT webhook_deliveries_pkey
    PRIMARY KEY (batch_id, endpoint_id);

ALTER TABLE webhook_attempts ADD COLUMN IF NOT EXISTS endpoint_id text NOT NULL DEFAULT '';
ALTER TABLE webhook_attempts DROP CONSTRAINT IF EXISTS webhook_attempts_pkey;
ALTER TABLE webhook_attempts ADD CONSTRAINT webhook_attempts_pkey
    PRIMARY KEY (batch_id, endpoint_id, attempt);
