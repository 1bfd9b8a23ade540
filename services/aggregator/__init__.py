"""aggregator: records row outcomes, moves counters, finalises jobs, announces progress."""
