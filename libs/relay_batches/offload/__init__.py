"""Offload to the providers' batch APIs: what every provider's batch client shares (custom
ids, the state of a batch, result lines read back in bounded memory); each provider's
client is its dialect's ``batch_api`` (:mod:`relay_batches.dialects`)."""
