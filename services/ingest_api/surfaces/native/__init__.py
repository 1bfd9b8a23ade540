"""The native surface: batches, results, uploads, deliveries, models."""

PREFIX = "/v1"  # where the application mounts this surface (see ..app)
