-- Token usage summed per job (rows keep their own in row_results).

ALTER TABLE batches ADD COLUMN IF NOT EXISTS prompt_tokens bigint NOT NULL DEFAULT 0;
ALTER TABLE batches ADD COLUMN IF NOT EXISTS completion_tokens bigint NOT NULL DEFAULT 0;
