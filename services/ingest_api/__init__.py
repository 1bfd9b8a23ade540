"""ingest-api: the public HTTP API — accept, read, list, cancel, stream results."""
