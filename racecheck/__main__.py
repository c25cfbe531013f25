"""`python -m racecheck`: the same command line as the `racecheck` console script."""

from racecheck.cli import main

main()
