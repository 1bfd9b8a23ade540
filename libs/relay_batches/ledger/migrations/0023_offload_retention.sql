-- The retention reaper's scan of provider batch records (issue 18): the settled ones,
-- oldest end first. offload_batches is small (a record per provider batch) and no
-- service's hot path waits on its SHARE lock for long; batches is not touched.

CREATE INDEX IF NOT EXISTS offload_batches_settled
    ON offload_batches (ended_at) WHERE state = 'settled';
