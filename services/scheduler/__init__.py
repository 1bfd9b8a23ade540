"""scheduler: spawns queued runs of cron templates when their ticks fall due."""
