"""Lanes: the ways an alias answers a row (a provider's batch, flex, realtime), and the
plan that picks among them to meet a job's deadline at the lowest price."""
