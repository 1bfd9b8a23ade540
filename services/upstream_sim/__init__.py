"""upstream_sim: a local OpenAI-compatible chat completions server for tests and benchmarks."""
