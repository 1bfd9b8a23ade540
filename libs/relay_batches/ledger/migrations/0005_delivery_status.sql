-- Webhook deliveries CHECK their status like batches do (0001): exactly the values of
-- DeliveryStatus in relay_batches/model.py (a unit test compares the two lists).
-- Every value the notifier has ever written is one of these, so existing rows pass.

ALTER TABLE webhook_deliveries DROP CONSTRAINT IF EXISTS webhook_deliveries_status_check;
ALTER TABLE webhook_deliveries ADD CONSTRAINT webhook_deliveries_status_check
    CHECK (status IN ('sending', 'delivered', 'refused', 'failed'));
