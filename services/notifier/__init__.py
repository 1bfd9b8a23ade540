"""notifier: POSTs the completion webhook of every finished run, once, and each ended
batch's OpenAI event to its workspace's webhook endpoints."""
