"""dispatcher: claims queued jobs and releases their rows to the ``rows`` queue."""
