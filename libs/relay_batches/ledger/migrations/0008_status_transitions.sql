-- The allowed status transitions, as the database's own rule: the CHECKs (0001, 0006)
-- say which statuses exist, these tables and triggers say which moves between them are
-- allowed, exactly the JOB_STATUS_TRANSITIONS and DELIVERY_STATUS_TRANSITIONS of
-- relay_batches/model.py (an integration test compares the two). An UPDATE that moves
-- a job or a delivery any other way fails with check_violation; an UPDATE that leaves
-- the status as it is costs nothing (the trigger's WHEN skips it).

CREATE TABLE IF NOT EXISTS job_status_transitions (
    from_status text NOT NULL,
    to_status   text NOT NULL,
    PRIMARY KEY (from_status, to_status)
);
INSERT INTO job_status_transitions (from_status, to_status) VALUES
    ('queued', 'running'), ('queued', 'failed'), ('queued', 'canceled'),
    ('scheduled', 'canceled'),
    ('running', 'completed'), ('running', 'failed'), ('running', 'canceled')
ON CONFLICT DO NOTHING;

CREATE TABLE IF NOT EXISTS delivery_status_transitions (
    from_status text NOT NULL,
    to_status   text NOT NULL,
    PRIMARY KEY (from_status, to_status)
);
INSERT INTO delivery_status_transitions (from_status, to_status) VALUES
    ('sending', 'posting'), ('sending', 'failed'),
    ('posting', 'delivered'), ('posting', 'refused'), ('posting', 'failed'),
    ('posting', 'unknown'),
    ('unknown', 'delivered'), ('unknown', 'refused'), ('unknown', 'failed')
ON CONFLICT DO NOTHING;

CREATE OR REPLACE FUNCTION relay_guard_job_status() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM job_status_transitions
                   WHERE from_status = OLD.status AND to_status = NEW.status) THEN
        RAISE EXCEPTION 'job % may not move from % to %', OLD.id, OLD.status, NEW.status
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;

CREATE OR REPLACE FUNCTION relay_guard_delivery_status() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM delivery_status_transitions
                   WHERE from_status = OLD.status AND to_status = NEW.status) THEN
        RAISE EXCEPTION 'delivery of % may not move from % to %',
            OLD.batch_id, OLD.status, NEW.status
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;

DROP TRIGGER IF EXISTS batches_status_transition ON batches;
CREATE TRIGGER batches_status_transition
    BEFORE UPDATE OF status ON batches
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION relay_guard_job_status();

DROP TRIGGER IF EXISTS webhook_deliveries_status_transition ON webhook_deliveries;
CREATE TRIGGER webhook_deliveries_status_transition
    BEFORE UPDATE OF status ON webhook_deliveries
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION relay_guard_delivery_status();
