"""relay-offloader: rows of offloaded jobs through the providers' batch APIs."""
