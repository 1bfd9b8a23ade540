"""What the tests share: isolation, clients, processes, faults, checks and in-memory fakes."""
