-- Rows are whole chat requests, outcomes keep the whole answer, and a job may expire.
--
-- batch_rows.messages becomes batch_rows.request: a row's chat request as compact JSON,
-- either its messages array alone (every row stored before, and a row with nothing but
-- string messages) or an object with "messages" and the row's own fields (model, tools,
-- tool_choice, response_format, max_tokens, …). The rename takes ACCESS EXCLUSIVE on
-- batch_rows and scans nothing. Code of an earlier release reads and writes "messages":
-- its pods must be stopped before this migration runs (docs/operations/deployment.md, upgrading).
--
-- row_results keeps what the dialects render: the assistant's tool calls (JSON, the
-- chat-completions shape), the finish reason (chat-completions vocabulary) and the model
-- that answered, as the provider named it. Adding nullable columns scans nothing.
--
-- 'expired' is a new terminal status: a job past its expires_at (completion window)
-- ends there; rows without an outcome by then never run. The status CHECK is replaced
-- NOT VALID (ACCESS EXCLUSIVE on batches, but no scan: new and updated rows are checked
-- at once).
--
-- A migration runs in one transaction (ledger/migrate.py), so every lock taken here lasts
-- until its commit: this file holds only statements that scan nothing. The scans of
-- batches (VALIDATE, the two new indexes) are in 0013, a transaction of their own under
-- weaker locks, and the old outbox index is dropped in 0014 once its successor exists.

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM information_schema.columns
               WHERE table_name = 'batch_rows' AND column_name = 'messages'
                 AND table_schema = current_schema()) THEN
        ALTER TABLE batch_rows RENAME COLUMN messages TO request;
    END IF;
END $$;

ALTER TABLE row_results ADD COLUMN IF NOT EXISTS tool_calls text;
ALTER TABLE row_results ADD COLUMN IF NOT EXISTS finish_reason text;
ALTER TABLE row_results ADD COLUMN IF NOT EXISTS model text;

ALTER TABLE batches ADD COLUMN IF NOT EXISTS expires_at timestamptz;
-- A job's metadata: a JSON object of string pairs the client attached (the dialects'
-- ``metadata``), NULL for none.
ALTER TABLE batches ADD COLUMN IF NOT EXISTS metadata text;

ALTER TABLE batches DROP CONSTRAINT IF EXISTS batches_status_check;
ALTER TABLE batches ADD CONSTRAINT batches_status_check
    CHECK (status IN ('queued', 'scheduled', 'running', 'completed', 'failed', 'canceled',
                      'expired'))
    NOT VALID;

INSERT INTO job_status_transitions (from_status, to_status) VALUES
    ('queued', 'expired'), ('running', 'expired')
ON CONFLICT DO NOTHING;
