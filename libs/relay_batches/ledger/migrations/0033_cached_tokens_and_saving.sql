-- Prompt-cache reads and the saving against all-realtime (issue 32, items 4 and 5).
--
-- row_results.cached_tokens: the prompt tokens the provider read from its prompt cache
-- (OpenAI's usage.prompt_tokens_details.cached_tokens, Anthropic's
-- cache_read_input_tokens); NULL when none. row_results.all_realtime_usd: what the
-- answer's tokens would have cost at its realtime reference price (the alias's first
-- priced realtime deployment); NULL when unpriced.
-- batches.cached_tokens and batches.all_realtime_usd: their sums over the job's rows,
-- added by the statement that records them, once, as prompt_tokens and cost_usd are.
-- Nullable columns and constant defaults scan nothing.

ALTER TABLE row_results ADD COLUMN IF NOT EXISTS cached_tokens integer;
ALTER TABLE row_results ADD COLUMN IF NOT EXISTS all_realtime_usd double precision;
ALTER TABLE batches ADD COLUMN IF NOT EXISTS cached_tokens bigint NOT NULL DEFAULT 0;
ALTER TABLE batches ADD COLUMN IF NOT EXISTS all_realtime_usd double precision NOT NULL DEFAULT 0;
