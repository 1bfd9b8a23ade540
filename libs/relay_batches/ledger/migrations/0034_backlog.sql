-- The backlog gauges (issue 30): one dispatcher at a time reads the unfinished jobs'
-- counters every RELAY_BACKLOG_SECONDS and serves relay_backlog_* on its /metrics.
--
-- ledger_leases: a named lease a process renews while it does a ledger-wide chore, so
-- exactly one process does it and the others know it is done (a lease row, not an
-- advisory lock: it needs no connection held between passes and works behind a
-- transaction-mode PgBouncer). An expired lease is taken over by the next to ask.
CREATE TABLE IF NOT EXISTS ledger_leases (
    name        text PRIMARY KEY,
    owner       text NOT NULL,
    expires_at  timestamptz NOT NULL
);

-- The unfinished jobs, whatever their number of ended ones: the backlog's read is a scan
-- of this small partial index and of the rows it points to, never of batch_rows.
CREATE INDEX IF NOT EXISTS batches_unfinished
    ON batches (status) WHERE status IN ('queued', 'running', 'paused');
