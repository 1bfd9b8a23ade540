-- The outbox index that batches_unpublished_end (0013) replaces. DROP INDEX takes ACCESS
-- EXCLUSIVE on batches, so it is a transaction of its own: the lock is held for the
-- catalogue change only, never across an index build.

DROP INDEX IF EXISTS batches_unpublished_finish;
