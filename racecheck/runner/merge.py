"""Join the logs of several run folders (shards run on other machines or CI jobs) into one.

Shards of one run (`--shard i/N`) hold disjoint trials of the same suites and arms with the same
seed, so their logs concatenate into the log an unsharded run would have written. The merged
folder's run.json describes the whole run (no shard), so `racecheck run --resume MERGED` can fill
in the trials of a shard that never finished.

Inputs may be glob patterns (`'out/shard-*'`, quoted so that racecheck expands them), and a set of
shards must be whole: one folder for each of 1/N ... N/N, none missing and none twice.
"""

from __future__ import annotations

import glob
import shutil
from pathlib import Path

from racecheck.runner import state
from racecheck.runner.blocks import Shard
from racecheck.runner.record import TrialLog, read_log

# Settings that must agree for logs to be one experiment: everything that changes what a trial
# means. Arms and profiles are compared as resolved per suite (`scenarios` in run.json: each
# suite's arms and each arm's canonical profile spec), so `--arms` spelled out and the same arms by
# default agree, and so do a profile's name and the rules it stands for.
_SAME = (
    "source",
    "seed",
    "order",
    "detect",
    "backend",
    "pytest_args",
    "world_size",
    "mesh",
    "isolation",
    "chunk",
    "timeout",
    "revisions",
    "scenarios",
)


class MergeError(ValueError):
    """Inputs that cannot be merged (missing, overlapping, or different experiments)."""


def merge(inputs: list[Path], out: Path) -> int:
    """Write OUT/trials.jsonl, completed.jsonl and run.json from `inputs`; returns the records written."""
    if len(inputs) < 2:
        raise MergeError("give at least two run folders to merge" + _lone_shard(inputs))
    if (out / "trials.jsonl").exists():
        raise MergeError(f"{out} already holds a run; choose another --out")
    runs: list[dict] = []
    owner: dict[tuple[str, str, int], Path] = {}  # (suite, arm, trial) -> the folder that holds it
    seen: dict[Path, Path] = {}  # resolved folder -> as given
    for folder in inputs:
        if folder.resolve() == out.resolve():
            raise MergeError(f"{folder} is both an input and the output")
        if folder.resolve() in seen:
            raise MergeError(f"{seen[folder.resolve()]} and {folder} are the same run folder")
        seen[folder.resolve()] = folder
        if not (folder / "trials.jsonl").is_file():
            raise MergeError(f"{folder}: no trials.jsonl (not a racecheck run folder)")
        try:
            runs.append(state.read_run(folder))
        except ValueError as exc:
            raise MergeError(str(exc)) from None
    first = runs[0]
    for folder, run in zip(inputs[1:], runs[1:], strict=True):
        for setting in _SAME:
            if run.get(setting) != first.get(setting):
                raise MergeError(
                    f"{inputs[0]} and {folder} are different runs: their {setting} differs "
                    f"({first.get(setting)!r} vs {run.get(setting)!r})"
                )
    check_shards(inputs, runs)
    records = []
    for folder in inputs:
        bad: list = []
        try:
            mine = list(read_log(folder / "trials.jsonl", bad_lines=bad))
        except (OSError, ValueError) as exc:  # unreadable, or a line that is not a trial record
            raise MergeError(str(exc)) from None
        if bad:
            raise MergeError(
                f"{folder / 'trials.jsonl'}: {bad[0].describe()}; 'racecheck run --resume "
                f"{folder}' repairs the log and reruns what it lost"
            )
        for r in mine:
            key = (r.scenario, r.arm, r.trial)
            if owner.get(key, folder) != folder:
                raise MergeError(
                    f"{owner[key]} and {folder} both hold trial {r.trial} of arm {r.arm!r}"
                    f" ({r.scenario}): shards must hold disjoint trials (--shard i/N)"
                )
            owner[key] = folder
            records.append(r)
    out.mkdir(parents=True, exist_ok=True)
    with TrialLog(out / "trials.jsonl") as log:
        for r in records:
            log.append(r)
    with open(out / state.COMPLETED_FILE, "w", encoding="utf-8") as fh:
        for folder in inputs:
            try:
                with open(folder / state.COMPLETED_FILE, encoding="utf-8") as src:
                    shutil.copyfileobj(src, fh)
            except FileNotFoundError:
                pass
    merged = dict(first)
    merged["trials"] = max(int(r.get("trials", 0)) for r in runs)
    merged["shard"] = "1/1"
    merged["merged_from"] = [str(p) for p in inputs]
    merged["attempts"] = [a for r in runs for a in r.get("attempts", [])]
    state.write_run(out, merged)
    return len(records)


def expand_inputs(patterns, out: Path) -> list[Path]:
    """The run folders that `patterns` name: each a folder, or a glob of folders (sorted; the
    output folder and plain files excluded). MergeError for a pattern that matches no folder."""
    folders = []
    for pattern in map(str, patterns):
        if not glob.has_magic(pattern):
            folders.append(Path(pattern))
            continue
        found = [
            Path(p) for p in sorted(glob.glob(pattern)) if Path(p).is_dir() and Path(p).resolve() != Path(out).resolve()
        ]
        if not found:
            raise MergeError(f"{pattern}: no run folder matches")
        folders += found
    return folders  # a folder named twice is merge()'s to refuse, naming both


def check_shards(inputs: list[Path], runs: list[dict]) -> None:
    """Shards of one run must be complete and distinct: MergeError naming the shard missing or
    given twice. Runs that are no shards (1/1, e.g. machines that each ran every trial) pass;
    the trial-overlap check judges them."""
    shards = [_shard(folder, run) for folder, run in zip(inputs, runs, strict=True)]
    counts = {s.count for s in shards}
    if counts == {1}:
        return
    if len(counts) > 1:
        raise MergeError(
            "the folders are shards of different splits: "
            + ", ".join(f"{folder} is {shard}" for folder, shard in zip(inputs, shards, strict=True))
        )
    count = counts.pop()
    holder: dict[int, Path] = {}
    for folder, shard in zip(inputs, shards, strict=True):
        if shard.index in holder:
            raise MergeError(f"shard {shard} is given twice: {holder[shard.index]} and {folder}")
        holder[shard.index] = folder
    missing = [f"{i}/{count}" for i in range(1, count + 1) if i not in holder]
    if missing:
        raise MergeError(
            f"shard{'s' if len(missing) > 1 else ''} {', '.join(missing)} missing "
            f"(given: {', '.join(f'{i}/{count}' for i in sorted(holder))})"
        )


def _shard(folder: Path, run: dict) -> Shard:
    try:
        return Shard.parse(str(run.get("shard", "1/1")))
    except ValueError as exc:
        raise MergeError(f"{folder}: run.json: shard {exc}") from None


def _lone_shard(inputs: list[Path]) -> str:
    """`; shard 2/2 is missing` when the one input is a shard of a larger split."""
    try:
        shard = _shard(inputs[0], state.read_run(inputs[0])) if inputs else Shard()
    except ValueError:
        return ""
    others = [f"{i}/{shard.count}" for i in range(1, shard.count + 1) if i != shard.index]
    return f" ({inputs[0]} is shard {shard}; missing: {', '.join(others)})" if others else ""
