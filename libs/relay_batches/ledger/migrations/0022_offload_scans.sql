-- The scan 0021 leaves out of its exclusive lock: the index of the offloaded running jobs
-- whose released rows the offloader has not taken in yet (its intake's scan). SHARE on
-- batches: reads go on, writes wait for the build (about a second per million jobs).

CREATE INDEX IF NOT EXISTS batches_offloaded
    ON batches (id) WHERE offload_deployment IS NOT NULL AND status = 'running';
