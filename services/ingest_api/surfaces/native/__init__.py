"""The native surface under ``/v1``: batches, results, uploads, deliveries, models."""
