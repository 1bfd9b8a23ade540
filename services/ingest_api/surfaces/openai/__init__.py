"""The OpenAI-compatible surface under ``/openai/v1``: files and batches."""
