"""`--shard auto`: which slice of the trials this job runs, read from the job's environment.

A scheduler that spreads independent jobs says which job this is; racecheck turns that into a
`Shard` (blocks.py) so that the same command line runs on every job:
- `RACECHECK_SHARD=i/N`, set by hand or by any CI matrix (GitHub Actions, GitLab, Buildkite);
  it wins over everything else, so it can also correct a scheduler's numbering;
- a Slurm job array: `SLURM_ARRAY_TASK_ID` with the array's size, `SLURM_ARRAY_TASK_COUNT`, or
  its range, `SLURM_ARRAY_TASK_MIN`/`MAX` (and `SLURM_ARRAY_TASK_STEP` for `--array=0-12:4`).
  Task ids map to shards in order: the array's lowest id is shard 1. An array given as a list
  (`--array=1,4,9`) has no step that maps ids to slices: set RACECHECK_SHARD there.

The run folder's run.json keeps the shard and where it came from (`shard_source`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from racecheck.runner.blocks import Shard

SHARD_VAR = "RACECHECK_SHARD"
# Every variable from_environment reads: racecheck's own, then a Slurm job array's.
VARIABLES = (SHARD_VAR, *(f"SLURM_ARRAY_TASK_{part}" for part in ("ID", "COUNT", "MIN", "MAX", "STEP")))


@dataclasses.dataclass(frozen=True)
class JobShard:
    shard: Shard
    source: str  # e.g. "SLURM_ARRAY_TASK_ID=5 (tasks 4-7)", kept in run.json


def from_environment(env: Mapping[str, str]) -> JobShard:
    """The shard of this job; ValueError (one line) when the environment names none or is inconsistent."""
    explicit = env.get(SHARD_VAR, "").strip()
    if explicit:
        try:
            return JobShard(Shard.parse(explicit), f"{SHARD_VAR}={explicit}")
        except ValueError as exc:
            raise ValueError(f"{SHARD_VAR}: {exc}") from None
    if env.get("SLURM_ARRAY_TASK_ID", "").strip():
        return _slurm(env)
    raise ValueError(
        f"no job environment names a shard: set {SHARD_VAR}=i/N (a CI matrix), or run "
        f"in a Slurm job array (SLURM_ARRAY_TASK_ID)"
    )


def _number(env: Mapping[str, str], name: str) -> int | None:
    text = env.get(name, "").strip()
    if not text:
        return None
    if not text.isdigit():
        raise ValueError(f"{name}={text!r} is not a whole number")
    return int(text)


def _slurm(env: Mapping[str, str]) -> JobShard:
    task = _number(env, "SLURM_ARRAY_TASK_ID")
    if task is None:
        raise ValueError("SLURM_ARRAY_TASK_ID is not set: not a task of a Slurm job array")
    count = _number(env, "SLURM_ARRAY_TASK_COUNT")
    low = _number(env, "SLURM_ARRAY_TASK_MIN")
    high = _number(env, "SLURM_ARRAY_TASK_MAX")
    step = _number(env, "SLURM_ARRAY_TASK_STEP") or 1
    if low is None and high is None:
        if count is None:
            raise ValueError(
                "SLURM_ARRAY_TASK_ID without SLURM_ARRAY_TASK_COUNT or SLURM_ARRAY_TASK_MIN/MAX: "
                f"cannot tell how many shards there are; set {SHARD_VAR}=i/N"
            )
        low = 0  # only the count known: the ids 0..count-1 of `--array=0-(count-1)`
    if low is None:
        raise ValueError(f"SLURM_ARRAY_TASK_MAX without SLURM_ARRAY_TASK_MIN; set {SHARD_VAR}=i/N")
    if high is None:
        if count is None:
            raise ValueError(f"SLURM_ARRAY_TASK_MIN without SLURM_ARRAY_TASK_MAX or _COUNT; set {SHARD_VAR}=i/N")
        high = low + (count - 1) * step
    span = (high - low) // step + 1 if high >= low else 0
    if count is None:
        count = span
    if span != count or (high - low) % step:
        raise ValueError(
            f"the Slurm array (tasks {low}-{high}, step {step}, {count} tasks) is not an even "
            f"range of ids; set {SHARD_VAR}=i/N for each task"
        )
    steps = f":{step}" if step != 1 else ""
    if not low <= task <= high or (task - low) % step:
        raise ValueError(f"SLURM_ARRAY_TASK_ID={task} is not a task of the array {low}-{high}{steps}")
    index = (task - low) // step + 1
    return JobShard(Shard(index, count), f"SLURM_ARRAY_TASK_ID={task} (tasks {low}-{high}{steps})")
