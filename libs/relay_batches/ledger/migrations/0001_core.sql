-- Core ledger: workspaces, api keys, batches (jobs and cron templates), rows, results,
-- webhook deliveries.

CREATE TABLE IF NOT EXISTS workspaces (
    id          text PRIMARY KEY CHECK (id ~ '^[0-9a-f]{32}$'),
    name        text NOT NULL UNIQUE,
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS api_keys (
    id            text PRIMARY KEY CHECK (id ~ '^[0-9a-f]{32}$'),
    workspace_id  text NOT NULL REFERENCES workspaces (id),
    key_hash      bytea NOT NULL UNIQUE,
    prefix        text NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    revoked_at    timestamptz
);

CREATE TABLE IF NOT EXISTS batches (
    id                  text PRIMARY KEY CHECK (id ~ '^[0-9a-f]{32}$'),
    workspace_id        text NOT NULL REFERENCES workspaces (id),
    name                text NOT NULL,
    model               text NOT NULL,
    priority            integer NOT NULL DEFAULT 0,
    status              text NOT NULL CHECK (status IN
                            ('queued', 'scheduled', 'running', 'completed', 'failed', 'canceled')),
    total               integer NOT NULL CHECK (total > 0),
    completed           integer NOT NULL DEFAULT 0,
    failed              integer NOT NULL DEFAULT 0,
    dead_letter         integer NOT NULL DEFAULT 0,
    webhook_url         text,
    cron                text,
    next_run_at         timestamptz,
    template_id         text REFERENCES batches (id),
    rows_batch_id       text NOT NULL,
    params              text NOT NULL DEFAULT '{}',
    error               text,
    created_at          timestamptz NOT NULL DEFAULT now(),
    started_at          timestamptz,
    completed_at        timestamptz,
    dispatched_upto     integer NOT NULL DEFAULT 0,
    lease_owner         text,
    lease_expires_at    timestamptz,
    last_progress_at    timestamptz,
    finished_published  boolean NOT NULL DEFAULT false,
    CHECK (completed + failed <= total)
);

CREATE INDEX IF NOT EXISTS batches_queued_order
    ON batches (priority DESC, created_at) WHERE status = 'queued';
CREATE INDEX IF NOT EXISTS batches_running ON batches (lease_expires_at) WHERE status = 'running';
CREATE INDEX IF NOT EXISTS batches_workspace_list
    ON batches (workspace_id, created_at DESC, id DESC);
CREATE INDEX IF NOT EXISTS batches_unpublished_finish
    ON batches (completed_at) WHERE NOT finished_published
        AND status IN ('completed', 'failed', 'canceled');

CREATE TABLE IF NOT EXISTS batch_rows (
    batch_id    text NOT NULL,
    row_index   integer NOT NULL,
    custom_id   text NOT NULL,
    messages    text NOT NULL,
    PRIMARY KEY (batch_id, row_index)
);

CREATE TABLE IF NOT EXISTS row_results (
    batch_id           text NOT NULL,
    row_index          integer NOT NULL,
    content            text,
    error              text,
    attempts           integer NOT NULL,
    dead_letter        boolean NOT NULL DEFAULT false,
    deployment         text,
    prompt_tokens      integer NOT NULL DEFAULT 0,
    completion_tokens  integer NOT NULL DEFAULT 0,
    created_at         timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (batch_id, row_index),
    CHECK ((content IS NULL) <> (error IS NULL))
);

CREATE TABLE IF NOT EXISTS webhook_deliveries (
    batch_id      text PRIMARY KEY REFERENCES batches (id),
    url           text NOT NULL,
    status        text NOT NULL,
    status_code   integer,
    error         text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    finished_at   timestamptz
);
