"""The service kit: what every bus-driven service runs on.

A service declares its intakes (:mod:`.consumer`: a queue with its decoder, handler
and prefetch; job events by routing key; a queue taken in chunks), its periodic tasks
(:mod:`.periodic`) and its ledger check; :class:`.base.BusService` runs them, answers
readiness and drains on stop. Logic stays in each service's ``core.py``.
"""
