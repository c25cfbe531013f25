"""Arms, the trial runner, the JSONL trial log, tallies, statistics, gates and reports."""
