-- Retention: a workspace's own retention of ended jobs (NULL: RELAY_RETENTION). A
-- nullable column without a default is a catalogue change only: no rewrite, no scan.

ALTER TABLE workspaces ADD COLUMN IF NOT EXISTS retention interval;

-- The row tables lose a retention's worth of rows a day: have autovacuum free that space
-- for reuse after 2 % of a table is dead, not the default 20 % (days of growth at
-- 30 days' retention). A storage parameter: SHARE UPDATE EXCLUSIVE, no scan.
ALTER TABLE batch_rows SET (autovacuum_vacuum_scale_factor = 0.02);
ALTER TABLE row_results SET (autovacuum_vacuum_scale_factor = 0.02);
