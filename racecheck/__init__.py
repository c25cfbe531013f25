"""racecheck: make stream/allocator races in sharded data-parallel training happen, vanish, and show."""

__version__ = "0.1.0"
