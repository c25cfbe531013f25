"""What runs inside a pytest process that racecheck started (a rank) or that loads its plugin:

- plugin.py: the pytest plugin (entry point `pytest11`), which repeats the tests once per block of
  the session's schedule, keeps each item's trial (item_trial.py) and writes its outcome as a rank
  event (rank_log.py); failure_text.py names a failure, param_targets.py keeps a parametrized
  target, collect.py keeps run folders out of the collection;
- harness.py: one test's perturbation and detector, installed around it and read back after it,
  for the catalogue's runtime fixture and a project's suite alike (detectors.py: the two
  detectors); project.py: patch mode and the tracker as a project's suite runs them.

It imports nothing of the runner: what the runner says comes through racecheck.protocol.
"""
