"""Relay's services, one package each: wiring, a short service declaration and its core logic."""
