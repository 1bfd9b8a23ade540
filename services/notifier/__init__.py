"""notifier: POSTs the completion webhook of every finished run, once."""
