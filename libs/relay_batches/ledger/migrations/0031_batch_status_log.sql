-- batch_status_log: every status change of a job, dated, for its timeline
-- (GET /v1/batches/{id}/timeline: paused, resumed, finished). Written by a trigger in the
-- statement that changes the status, so no path that moves a job can forget it; a
-- status change is a handful of times per job (a pause and resume each add two), never
-- per row. Its rows go with their job (ON DELETE CASCADE: deletion and retention).
CREATE TABLE IF NOT EXISTS batch_status_log (
    batch_id    text NOT NULL REFERENCES batches (id) ON DELETE CASCADE,
    at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    from_status text NOT NULL,
    to_status   text NOT NULL
);
CREATE INDEX IF NOT EXISTS batch_status_log_batch ON batch_status_log (batch_id, at);

CREATE OR REPLACE FUNCTION relay_log_job_status() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO batch_status_log (batch_id, from_status, to_status)
    VALUES (NEW.id, OLD.status, NEW.status);
    RETURN NULL;
END $$;

DROP TRIGGER IF EXISTS batches_status_log ON batches;
CREATE TRIGGER batches_status_log
    AFTER UPDATE OF status ON batches
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION relay_log_job_status();
