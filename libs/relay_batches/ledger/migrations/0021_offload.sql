-- Offload to the providers' batch APIs (issue 18).
--
-- A migration runs in one transaction: this one holds only statements that scan nothing
-- of batches (its ACCESS EXCLUSIVE lock for the new columns lasts to the commit); the
-- index on batches is built in 0022, under a SHARE lock of its own.
--
-- batches.offload_deployment: the batch deployment a job was offloaded to, set once by
-- its dispatcher in the statement of its first release (then every row is released at
-- once and the offloader owns them); NULL for a job that runs realtime.
-- batches.offload_upto: how far the offloader has taken the job's released rows into
-- offload_rows (rows below it are recorded there). Nullable and NOT NULL DEFAULT columns
-- are catalogue changes: no rewrite, no scan.
ALTER TABLE batches ADD COLUMN IF NOT EXISTS offload_deployment text;
ALTER TABLE batches ADD COLUMN IF NOT EXISTS offload_upto integer NOT NULL DEFAULT 0;

-- One provider batch: recorded (its rows chosen, in this transaction) → creating (input
-- uploaded, OpenAI) → submitted (the provider holds it) → ended (its results may be
-- read) → settled (every outcome published, every other row forwarded). canceling: every
-- row belongs to jobs that ended; the provider is asked to cancel it, then it ends.
CREATE TABLE IF NOT EXISTS offload_batches (
    id              bigserial PRIMARY KEY,
    deployment      text NOT NULL,
    state           text NOT NULL CHECK (state IN
                        ('recorded', 'creating', 'submitted', 'canceling', 'ended', 'settled')),
    provider_id     text UNIQUE,
    input_file_id   text,
    output_file_id  text,  -- OpenAI's output file; Anthropic's results URL
    error_file_id   text,  -- OpenAI's error file
    rows            integer NOT NULL CHECK (rows > 0),
    bytes           bigint NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    submitted_at    timestamptz,
    ended_at        timestamptz,
    next_poll_at    timestamptz NOT NULL DEFAULT now(),
    polls           integer NOT NULL DEFAULT 0,  -- polls since progress; creates tried
    progress        integer NOT NULL DEFAULT 0,  -- requests the provider had finished
    owner           text,
    lease_until     timestamptz,
    error           text  -- the provider batch failed as a whole: every row is forwarded
);

CREATE INDEX IF NOT EXISTS offload_batches_open
    ON offload_batches (next_poll_at) WHERE state <> 'settled';

-- One offloaded row: pending (waiting to be gathered) → submitted (in provider_batch) →
-- done (its outcome published); forward (to go realtime) → forwarded (published as an
-- ordinary row); dropped (its job ended before it was submitted). Removed with its job
-- (delete and retention delete the job; the cascade takes its offload rows).
CREATE TABLE IF NOT EXISTS offload_rows (
    batch_id        text NOT NULL REFERENCES batches (id) ON DELETE CASCADE,
    row_index       integer NOT NULL,
    deployment      text NOT NULL,
    provider_batch  bigint REFERENCES offload_batches (id),
    state           text NOT NULL CHECK (state IN
                        ('pending', 'submitted', 'done', 'forward', 'forwarded', 'dropped')),
    bytes           integer NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (batch_id, row_index)
);

CREATE INDEX IF NOT EXISTS offload_rows_pending
    ON offload_rows (deployment, created_at, batch_id, row_index) WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS offload_rows_forward
    ON offload_rows (batch_id, row_index) WHERE state = 'forward';
CREATE INDEX IF NOT EXISTS offload_rows_provider_batch
    ON offload_rows (provider_batch, batch_id, row_index) WHERE provider_batch IS NOT NULL;
