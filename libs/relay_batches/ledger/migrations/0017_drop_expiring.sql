-- The reaper's index that batches_expiring_live (0016) replaces. DROP INDEX takes ACCESS
-- EXCLUSIVE on batches, so it is a transaction of its own: the lock is held for the
-- catalogue change only.

DROP INDEX IF EXISTS batches_expiring;
