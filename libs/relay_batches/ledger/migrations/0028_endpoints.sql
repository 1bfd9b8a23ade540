-- batches.endpoint: the OpenAI endpoint a job's rows are bodies of (issue 28): chat
-- completions, embeddings, completions, moderations or responses. Each row of a job of
-- another endpoint than chat stores it too, in its request ("endpoint"), so a worker
-- knows it from the row alone; the column is what the surfaces show and how they render
-- the answers. files.endpoint: the url every line of an uploaded OpenAI batch file names
-- (NULL: a file from before this column, whose lines could only name chat completions).
--
-- A column with a constant default is a catalogue change since Postgres 11: no rewrite.

ALTER TABLE batches ADD COLUMN IF NOT EXISTS endpoint text NOT NULL
    DEFAULT '/v1/chat/completions';
ALTER TABLE files ADD COLUMN IF NOT EXISTS endpoint text;
