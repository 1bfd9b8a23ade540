-- row_results.body: the provider's whole reply (compact JSON) for an answer that carries
-- more than the outcome's columns hold: several choices (``n`` above 1), log
-- probabilities, audio, web-search annotations (issue 28). The OpenAI output file shows
-- it as the line's body; NULL for every other answer (the common case stores nothing
-- more). Adding a nullable column scans nothing.

ALTER TABLE row_results ADD COLUMN IF NOT EXISTS body text;
