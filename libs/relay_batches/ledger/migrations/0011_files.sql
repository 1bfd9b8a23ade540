-- The OpenAI-compatible surface: files and the batches created from them.
--
-- files: every file of a workspace. An uploaded input file (purpose 'batch') keeps its
-- bytes as uploaded in file_parts (bytea chunks, in order) and its parsed requests as
-- batch_rows under its own id (a job created from it runs them via rows_batch_id,
-- nothing copied); line_errors is the JSON list of what is wrong with its lines
-- ({code, message, param, line}), NULL for a clean file. An output or error file
-- (purpose 'batch_output') has no parts: its content is rendered from the batch's
-- outcomes when read, and its byte count is measured once, when it is first shown.
-- A deleted file keeps its row (deleted_at set) so an output file is never shown again.
CREATE TABLE IF NOT EXISTS files (
    id            text PRIMARY KEY CHECK (id ~ '^[0-9a-f]{32}$'),
    workspace_id  text NOT NULL REFERENCES workspaces (id),
    filename      text NOT NULL,
    purpose       text NOT NULL CHECK (purpose IN ('batch', 'batch_output')),
    bytes         bigint NOT NULL CHECK (bytes >= 0),
    rows          integer NOT NULL DEFAULT 0 CHECK (rows >= 0),
    model         text,
    line_errors   text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    deleted_at    timestamptz
);

CREATE INDEX IF NOT EXISTS files_workspace_list
    ON files (workspace_id, created_at DESC, id DESC) WHERE deleted_at IS NULL;

CREATE TABLE IF NOT EXISTS file_parts (
    file_id  text NOT NULL,
    part     integer NOT NULL,
    data     bytea NOT NULL,
    PRIMARY KEY (file_id, part)
);

-- A batch created on the OpenAI surface: its input file, the ids its output and error
-- files get once it ends, what it was created with, and (a file that failed
-- validation) the errors of its input. The job itself is an ordinary row of batches.
CREATE TABLE IF NOT EXISTS openai_batches (
    batch_id           text PRIMARY KEY CHECK (batch_id ~ '^[0-9a-f]{32}$'),
    workspace_id       text NOT NULL REFERENCES workspaces (id),
    input_file_id      text NOT NULL,
    output_file_id     text NOT NULL UNIQUE,
    error_file_id      text NOT NULL UNIQUE,
    endpoint           text NOT NULL,
    completion_window  text NOT NULL,
    errors             text,
    created_at         timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX IF NOT EXISTS openai_batches_workspace_list
    ON openai_batches (workspace_id, created_at DESC, batch_id DESC);
CREATE INDEX IF NOT EXISTS openai_batches_input ON openai_batches (input_file_id);
