"""The HTTP edge every surface shares: body limits, key auth, idempotency, paging, the
server's own protocol errors, timing."""
