-- A delivery is marked 'posting' right before its POST, so a notifier taking over an
-- expired claim never POSTs one that may have been sent; such a claim becomes 'unknown'
-- (its holder, if alive, still records the outcome). The CHECK lists exactly the values
-- of DeliveryStatus in relay_batches/model.py (a unit test compares the two lists).

ALTER TABLE webhook_deliveries DROP CONSTRAINT IF EXISTS webhook_deliveries_status_check;
ALTER TABLE webhook_deliveries ADD CONSTRAINT webhook_deliveries_status_check
    CHECK (status IN ('sending', 'posting', 'delivered', 'refused', 'failed', 'unknown'));

CREATE INDEX IF NOT EXISTS webhook_deliveries_posting
    ON webhook_deliveries (claim_expires_at) WHERE status = 'posting';

-- Deliveries deferred while their receiver was busy: sending, never claimed (claims 0).
CREATE INDEX IF NOT EXISTS webhook_deliveries_deferred
    ON webhook_deliveries (created_at) WHERE status = 'sending' AND claims = 0;
