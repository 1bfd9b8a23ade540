"""The Anthropic-compatible surface under ``/anthropic/v1``: message batches."""
