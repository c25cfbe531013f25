"""What run.json keeps of a run's settings, and how each reads back for `--resume` and `merge`:
checked as the command line checks it, the options' as their rows say (option_table.py, by
options.read_back), the rest here. RunConfig.to_json writes them (run_config.py);
settings_from_json is the one reader of them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from racecheck.runner import option_table, options
from racecheck.runner.state import RUN_FILE
from racecheck.suites import source as suite_source

# The settings run.json keeps, in RunConfig's order: every field but the suites (reloaded from
# `source`), the folder itself, the limits of one invocation (--max-time, --stop-when), and what
# fit_worlds finds on the machine that resumes (its GPUs decide the worlds and the suites skipped;
# run.json shows the writer's, WRITTEN_FOR_READERS, which no reader takes back).
KEPT = (
    "arms",
    "trials",
    "perturb",
    "seed",
    "isolation",
    "order",
    "chunk",
    "timeout",
    "backend",
    "detect",
    "pytest_args",
    "all_arms",
    "world_size",
    "mesh",
    "shard",
    "shard_source",
    "revisions",
    "source",
    "fingerprints",
)
WRITTEN_FOR_READERS = ("worlds", "skipped")


def _object(value) -> dict:
    if not isinstance(value, dict):
        raise ValueError(f"{str(value)[:40]!r} is not an object")
    return dict(value)


# How each kept setting reads back; a value that does not is a ValueError naming it.
READ_BACK: dict[str, Callable[[Any], Any]] = {
    **{o.name: options.read_back(o) for o in option_table.ALL if o.kept},
    "all_arms": options.read_flag,
    "shard_source": lambda v: v if isinstance(v, str) else str(v),
    "revisions": _object,
    "source": lambda v: suite_source.without_from_out(_object(v)),
    "fingerprints": _object,
}


def settings_from_json(data: dict) -> dict:
    """The settings run.json keeps (KEPT) that `data` holds, each read back to its field's type;
    ValueError naming the first one that does not read back (`run.json: chunk: 0 is below 1`).
    The one reader of run.json's settings: --resume and merge."""
    values = {}
    for name in KEPT:
        if name not in data:
            continue
        try:
            values[name] = READ_BACK[name](data[name])
        except ValueError as exc:
            raise ValueError(f"{RUN_FILE}: {name}: {exc}") from None
    return values
