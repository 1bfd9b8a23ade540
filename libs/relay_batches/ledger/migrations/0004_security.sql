-- Security: per-workspace webhook signing secrets, key lookup by display prefix (the
-- hash is then compared in constant time), and Idempotency-Key records.

ALTER TABLE workspaces ADD COLUMN IF NOT EXISTS webhook_secret text;
CREATE INDEX IF NOT EXISTS api_keys_prefix ON api_keys (prefix);

CREATE TABLE IF NOT EXISTS idempotency_keys (
    workspace_id    text NOT NULL REFERENCES workspaces (id),
    key             text NOT NULL,
    request_hash    bytea NOT NULL,
    response_status integer NOT NULL,
    response_body   text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, key)
);

ALTER TABLE webhook_deliveries ADD COLUMN IF NOT EXISTS message_id text;
