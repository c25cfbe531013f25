"""What a run's log says: the tally (summary.csv), statistics, the CI gate and the report renderers."""
