-- Controls act on rows not yet started (issue 27): a pause hands back the rows a
-- row-worker held and had not started.
--
-- batches.pauses: how many times the job was paused. A slice carries the count of its
-- release; a row-worker told of pause N hands back the rows it has not started of the
-- job's slices released before it (their count is below N), and runs those released
-- after the resume. A NOT NULL DEFAULT column is a catalogue change: no rewrite, no scan.
ALTER TABLE batches ADD COLUMN IF NOT EXISTS pauses integer NOT NULL DEFAULT 0;

-- returned_rows: rows released to the broker that a row-worker handed back unstarted
-- (their job was paused), keyed by the pause count of the release they came from. They
-- are below the job's dispatched_upto and have no outcome; the job's dispatcher releases
-- them again first (marking them taken in the statement that reads them), and stall
-- recovery never counts one lost while it is not taken. Written by the aggregator
-- (ON CONFLICT DO NOTHING); a taken row stays, so a hand-back delivered again after the
-- row went out again adds nothing (a later pause hands it back from a later release, a
-- new key). Gone with their job.
CREATE TABLE IF NOT EXISTS returned_rows (
    batch_id   text NOT NULL REFERENCES batches (id) ON DELETE CASCADE,
    row_index  integer NOT NULL,
    pauses     integer NOT NULL,
    taken      boolean NOT NULL DEFAULT false,
    PRIMARY KEY (batch_id, row_index, pauses)
);
-- The rows waiting to go out again: what claims, renewals and stall recovery look at.
CREATE INDEX IF NOT EXISTS returned_rows_waiting ON returned_rows (batch_id, row_index)
    WHERE NOT taken;
