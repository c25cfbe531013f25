"""What the runner's process and the test processes (the ranks) share, and nothing else: the wire
between them. Nothing here imports torch, click or any other part of racecheck, so both sides,
and every layer below them, may import it.

- records.py, rank_events.py: the trial log's record and the events a rank appends to its log;
- schedule.py: the blocks (trial, arm, resolved perturbation) a session's steps run, as JSON;
- names.py: every `--racecheck-*` option the runner gives a session, every `RACECHECK_*` variable
  one side sets and the other reads, and the run folder's lock file that sessions never collect;
- mesh.py: the HSDP mesh as a value, sent to the ranks in the environment;
- one_rank.py: the environment of a one-rank session (torchrun's for its one worker), and the
  port of its own each pytest-xdist worker of it takes;
- lifeline.py: a process that dies with its parent;
- durable.py: append-only files that land whole or not at all (the logs of both sides);
- printable.py: failure text made writable as UTF-8.
"""
