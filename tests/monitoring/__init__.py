"""The monitoring files of ``deploy/monitoring`` and their checks (``make monitoring-check``)."""
