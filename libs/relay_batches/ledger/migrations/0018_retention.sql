-- Retention: a workspace's own retention of ended jobs (NULL: RELAY_RETENTION). A
-- nullable column without a default is a catalogue change only: no rewrite, no scan.

ALTER TABLE workspaces ADD COLUMN IF NOT EXISTS retention interval;
