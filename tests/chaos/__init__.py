"""Chaos tests: kill -9 and server disruptions in the middle of a batch."""
