"""The names the runner and the ranks both use, each spelled once: the `--racecheck-*` options
the runner gives a session's pytest (the plugin declares them from OPTIONS, the runner writes
them with `arg`), the `RACECHECK_*` variables one side sets and the other reads, and the run
folder's lock file, by which a session knows a run folder it must not collect.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Option:
    """A pytest option of the plugin: `--racecheck-NAME`, a flag when `kind` is bool."""

    name: str
    help: str
    kind: type = str  # the value's type: int, str, or bool for a flag
    metavar: str = ""
    default: object = None

    @property
    def flag(self) -> str:
        return f"--racecheck-{self.name}"

    @property
    def dest(self) -> str:
        """pytest's name for the option's value (`config.option.racecheck_stop_file`)."""
        return "racecheck_" + self.name.replace("-", "_")


STEPS = Option("steps", "run every test N times in this session, one block (trial, arm) per step", int, "N", 1)
SCHEDULE = Option(
    "schedule", "JSON list of the (trial, arm) block each repeat step runs (the runner's)", metavar="PATH"
)
SEED = Option("seed", "base seed; trial t runs with seed S + t", int, "S", 0)
DETECT = Option("detect", "run the happens-before detector and report races it finds", bool, default=False)
LOG = Option("log", "per-process JSONL outcome log; '{rank}' in PATH is replaced by the rank", metavar="PATH")
STOP_FILE = Option(
    "stop-file", "stop before trial T once PATH exists and holds T (the runner's graceful stop)", metavar="PATH"
)
PATCH = Option(
    "patch",
    "a suite not written against racecheck's runtime: install patch mode around every test with its "
    "profile, and with --racecheck-detect run it under TorchRaceTracker",
    bool,
    default=False,
)
HANDOFFS = Option(
    "handoffs", "where the systematic schedule keeps each test's hand-off points (the runner's)", metavar="DIR"
)
OPTIONS = (STEPS, SCHEDULE, SEED, DETECT, LOG, STOP_FILE, PATCH, HANDOFFS)


def arg(option: Option, value: object = True) -> str:
    """The command-line argument that gives `option` its `value` (a flag: the flag alone)."""
    if option.kind is bool:
        return option.flag
    return f"{option.flag}={value}"


# -- variables: set by the runner in a session's environment, read in its processes --------------
BACKEND_VAR = "RACECHECK_BACKEND"  # the stream runtime of `--backend` (racecheck.device)
MESH_VAR = "RACECHECK_MESH"  # `--mesh` as SHARDxREPLICATE, for people and logs (mesh.py)
MESH_SHARD_VAR = f"{MESH_VAR}_SHARD"  # ... and its two axes, which the ranks read
MESH_REPLICATE_VAR = f"{MESH_VAR}_REPLICATE"
SESSION_MARK_VAR = "RACECHECK_SESSION_MARK"  # every process of a session (runner/launch.py)
ONE_RANK_VAR = "RACECHECK_ONE_RANK"  # a one-rank session (one_rank.py): its xdist workers take ports of their own
RUNNER_TOKEN_VAR = "RACECHECK_RUNNER_TOKEN"  # the runner that started it (runner/state.Lock)
# Patch mode's actions in a project's suite: `recording` (the CPU twin, for tests) or unset (CUDA);
# the runner checks that they can act before a run, the ranks use them.
PATCH_ACTIONS_VAR = "RACECHECK_PATCH_ACTIONS"

# -- the run folder --------------------------------------------------------------------------------
LOCK_NAME = "runner.lock"  # taken by a run or a merge before it writes anything else
