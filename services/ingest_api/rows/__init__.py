"""Request rows: reading JSONL and CSV, the row rules, the job-level fields."""
