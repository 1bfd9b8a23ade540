"""Relay Batches shared library: settings, ids, messages, bus, ledger, router, runtime."""
