"""The OpenAI-compatible surface: files and batches."""

PREFIX = "/openai/v1"  # where the application mounts this surface (see ..app)
