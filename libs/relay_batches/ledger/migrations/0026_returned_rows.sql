-- Controls act on rows not yet started (issue 27): a pause hands back the rows a
-- row-worker held and had not started.
--
-- batches.pauses: how many times the job was paused. A slice carries the count of its
-- release; a row-worker told of pause N hands back the rows it has not started of the
-- job's slices released before it (their count is below N), and runs those released
-- after the resume. A NOT NULL DEFAULT column is a catalogue change: no rewrite, no scan.
ALTER TABLE batches ADD COLUMN IF NOT EXISTS pauses integer NOT NULL DEFAULT 0;

-- returned_rows: rows released to the broker that a row-worker handed back unstarted
-- (their job was paused). They are below the job's dispatched_upto and have no outcome;
-- the job's dispatcher releases them again first (deleting them here in the statement
-- that reads them), and stall recovery never counts them lost. Written by the
-- aggregator (idempotent: ON CONFLICT DO NOTHING), gone with their job.
CREATE TABLE IF NOT EXISTS returned_rows (
    batch_id   text NOT NULL REFERENCES batches (id) ON DELETE CASCADE,
    row_index  integer NOT NULL,
    PRIMARY KEY (batch_id, row_index)
);
