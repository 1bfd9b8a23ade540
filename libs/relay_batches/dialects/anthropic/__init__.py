"""The Anthropic wire format: its shapes, translation to and from the stored row, batch files and batch API."""
