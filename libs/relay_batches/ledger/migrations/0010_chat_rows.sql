-- Rows are whole chat requests, outcomes keep the whole answer, and a job may expire.
--
-- batch_rows.messages becomes batch_rows.request: a row's chat request as compact JSON,
-- either its messages array alone (every row stored before, and a row with nothing but
-- string messages) or an object with "messages" and the row's own fields (model, tools,
-- tool_choice, response_format, max_tokens, …). The rename takes a brief exclusive lock
-- and scans nothing.
--
-- row_results keeps what the dialects render: the assistant's tool calls (JSON, the
-- chat-completions shape), the finish reason (chat-completions vocabulary) and the model
-- that answered, as the provider named it. Adding nullable columns scans nothing.
--
-- 'expired' is a new terminal status: a job past its expires_at (completion window)
-- ends there; rows without an outcome by then never run. The status CHECK is replaced
-- NOT VALID and validated after (SHARE UPDATE EXCLUSIVE: reads and writes go on).

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
ALTER TABLE batches VALIDATE CONSTRAINT batches_status_check;

INSERT INTO job_status_transitions (from_status, to_status) VALUES
    ('queued', 'expired'), ('running', 'expired')
ON CONFLICT DO NOTHING;

-- The expiry scan: live jobs with a deadline, soonest first.
CREATE INDEX IF NOT EXISTS batches_expiring
    ON batches (expires_at) WHERE expires_at IS NOT NULL AND status IN ('queued', 'running');

-- The outbox scan of terminal jobs (aggregator), now with 'expired' among them.
CREATE INDEX IF NOT EXISTS batches_unpublished_end
    ON batches (completed_at) WHERE NOT finished_published
        AND status IN ('completed', 'failed', 'canceled', 'expired');
DROP INDEX IF EXISTS batches_unpublished_finish;
