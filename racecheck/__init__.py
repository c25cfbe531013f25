"""racecheck: make stream/allocator races in sharded data-parallel training happen, vanish, and show."""

from racecheck import compat

__version__ = "0.1.0"

compat.install()  # old module paths (racecheck.trials.*, racecheck.harness, ...): compat.MOVED
