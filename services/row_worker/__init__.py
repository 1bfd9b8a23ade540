"""row-worker: takes slices of rows, calls models through the router, publishes outcomes."""
