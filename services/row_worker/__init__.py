"""row-worker: takes row tasks, calls models through the router, publishes outcomes."""
