"""The Anthropic-compatible surface: message batches."""

PREFIX = "/anthropic/v1"  # where the application mounts this surface (see ..app)
