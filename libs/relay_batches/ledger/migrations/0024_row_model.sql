-- batch_rows.model: the alias a row names itself (its request's "model"), read once when
-- the row is stored (ledger/row_model.py), so that the offload intake routes rows by a
-- column instead of parsing every row's JSON inside its statement. NULL: the row names
-- none (a bare messages array, or an object without "model") and runs under its job's
-- alias; '': its request could not be read or its model no deployment could lead (a NUL
-- in it, or not a string), so no batch deployment takes it and it runs realtime.
--
-- A nullable column without a default is a catalogue change: no rewrite, no scan. Its
-- ACCESS EXCLUSIVE lock lasts to this migration's commit (a migration is one
-- transaction), so the rows stored before are filled in 0025, a transaction of its own
-- that takes no lock stronger than ROW EXCLUSIVE (reads and inserts go on meanwhile).
-- Code of an earlier release stores rows without a model: its pods must be stopped
-- before this migration runs (README, "Upgrading"), as for 0010.

ALTER TABLE batch_rows ADD COLUMN IF NOT EXISTS model text;
