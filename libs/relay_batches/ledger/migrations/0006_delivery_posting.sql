-- A delivery is marked 'posting' right before its POST, so a notifier taking over an
-- expired claim never POSTs one that may have been sent; such a claim becomes 'unknown'
-- (its holder, if alive, still records the outcome). The CHECK lists exactly the values
-- of DeliveryStatus in relay_batches/model.py (a unit test compares the two lists).
--
-- webhook_deliveries only grows, and a migration runs in one transaction (ledger/
-- migrate.py), so every lock taken here lasts until its commit. The CHECK is added NOT
-- VALID (ACCESS EXCLUSIVE, but no scan: new and updated rows are checked at once); the
-- scan of the existing rows (VALIDATE) and the new indexes are in 0009, a transaction
-- of their own under weaker locks.

ALTER TABLE webhook_deliveries DROP CONSTRAINT IF EXISTS webhook_deliveries_status_check;
ALTER TABLE webhook_deliveries ADD CONSTRAINT webhook_deliveries_status_check
    CHECK (status IN ('sending', 'posting', 'delivered', 'refused', 'failed', 'unknown'))
    NOT VALID;

-- A delivery deferred while its receiver was busy (nobody holds it) is flagged, not
-- marked by a claim number, so a claim handed back deferred keeps its number: claim
-- numbers only grow, and a holder cut off from the database can never find "its"
-- number again on a delivery another notifier claimed since. A constant default adds
-- the column without a rewrite or a scan.
ALTER TABLE webhook_deliveries ADD COLUMN IF NOT EXISTS deferred boolean NOT NULL DEFAULT false;
