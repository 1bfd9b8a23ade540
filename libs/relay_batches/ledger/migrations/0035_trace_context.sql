-- batches.traceparent: the W3C trace context of a job that is traced (sampled when it was
-- submitted; NULL for every other job, which then costs nothing to trace). Written with the
-- job's INSERT; the dispatcher's claim, the aggregator's counters and the notifier read it
-- with the row they read anyway, so each service's spans of the job land in its trace.
-- Text of 55 characters (00-<trace id>-<span id>-<flags>); see docs/operations/tracing.md.
ALTER TABLE batches ADD COLUMN IF NOT EXISTS traceparent text;
