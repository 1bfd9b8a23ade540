"""Offload to the providers' batch APIs: the lines of an input file, the results read
back, and one HTTP client per provider (OpenAI Files + Batches, Anthropic Message
Batches)."""
