"""Join the logs of several run folders (shards run on other machines or CI jobs) into one.

Shards of one run (`--shard i/N`) hold disjoint trials of the same suites and arms with the same
seed, so their logs concatenate into the log an unsharded run would have written. The merged
folder's run.json describes the whole run (no shard), so `racecheck run --resume MERGED` can fill
in the trials of a shard that never finished.

Inputs may be glob patterns (`'out/shard-*'`, quoted so that racecheck expands them), and a set of
shards must be whole: one folder for each of 1/N ... N/N, none missing and none twice, and none
with an empty log where it planned trials (a shard that holds fewer than it planned is named).

The output folder is taken as a run takes its own: never a folder of someone else's files, locked
while the merge writes (state.Lock), and written whole or not at all (_commit).
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import signal
from pathlib import Path

from racecheck.protocol.records import TrialRecord
from racecheck.runner import run_location, state
from racecheck.runner.blocks import Shard
from racecheck.runner.command_lines import resume_command
from racecheck.runner.run_folder import RunFolder, RunFolderError, open_run_folder, path_problem
from racecheck.suites import source as suite_source
from racecheck.suites.fingerprint import DEFINITION, changes

# Settings that must agree for logs to be one experiment: everything that changes what a trial
# means. Arms and profiles are compared as resolved per suite (`scenarios` in run.json: each
# suite's arms and each arm's canonical profile spec), so `--arms` spelled out and the same arms by
# default agree, and so do a profile's name and the rules it stands for.
# The suites themselves are compared by what they are (_check_same_suites), not where they lay.
_SAME = (
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


_STAGED = "merge"  # the suffix of a merge's temporary files: OUT/.NAME.PID.merge


class MergeError(ValueError):
    """Inputs that cannot be merged (missing, overlapping, or different experiments)."""


@dataclasses.dataclass(frozen=True)
class Merged:
    """What a merge wrote: the records, and what the caller should tell the user (a shard that
    holds fewer trials than it planned)."""

    records: int
    notes: tuple[str, ...] = ()


def merge(inputs: list[Path], out: Path) -> Merged:
    """Write OUT/trials.jsonl, completed.jsonl and run.json from `inputs`, whole or not at all
    (_commit), with OUT locked against a run or another merge (state.Lock). MergeError for inputs
    that do not make one run and for an OUT that already holds one or is no racecheck folder;
    state.FolderInUse while another racecheck process holds OUT."""
    if len(inputs) < 2:
        raise MergeError("give at least two run folders to merge" + _lone_shard(inputs))
    try:
        state.check_out_folder(out)
    except state.ForeignFolder as exc:
        raise MergeError(f"--out {exc}") from None
    linked = run_location.linked_entry(out)
    if linked:
        raise MergeError(f"--out {linked}")
    folders = _read_runs(inputs, out)
    runs = [f.run for f in folders]
    settings = [f.settings for f in folders]
    first = runs[0]
    _check_same_suites(inputs, settings)
    for folder, run in zip(inputs[1:], runs[1:], strict=True):
        for setting in _SAME:
            if run.get(setting) != first.get(setting):
                raise MergeError(
                    f"{inputs[0]} and {folder} are different runs: their {setting} differs "
                    f"({first.get(setting)!r} vs {run.get(setting)!r})"
                )
    check_shards(inputs, runs)
    records, notes = _read_records(inputs, folders)
    merged = dict(first)
    # Where the first input's suites lie now, kept also relative to the merged folder.
    merged["source"] = suite_source.kept(suite_source.located(_source(first), inputs[0]), run_location.absolute(out))
    merged["trials"] = max(kept.get("trials", 0) for kept in settings)
    merged["shard"] = "1/1"
    merged["merged_from"] = [str(p) for p in inputs]
    merged["attempts"] = [a for r in runs for a in r.get("attempts", [])]
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise MergeError(f"cannot create {out}: {exc.strerror or exc}") from None
    lock = state.Lock(out)
    try:
        lock.acquire()
    except OSError as exc:
        raise MergeError(f"cannot write to {out}: {exc.strerror or exc}") from None
    try:
        log = out / "trials.jsonl"
        if log.exists() and log.stat().st_size:
            raise MergeError(f"{out} already holds a run; choose another --out")
        for left in out.glob(f".*.{_STAGED}"):  # a killed merge's: no merge but this one holds OUT
            left.unlink(missing_ok=True)
        _commit(out, records=records, completed=_completed(inputs), run=merged)
    finally:
        lock.release()
    return Merged(len(records), tuple(notes))


def _source(run: dict) -> dict:
    source = run.get("source")
    return source if isinstance(source, dict) else {}


def _check_same_suites(inputs: list[Path], settings: list[dict]) -> None:
    """MergeError unless every input ran the same suites (`settings`: each input's as read back):
    of one kind and names (identity), with the same fingerprints (suites/fingerprint.py: its
    definition and test files). Where they were checked out does not count: shards from
    checkouts at different paths are one run."""
    first = settings[0]
    for folder, kept in zip(inputs[1:], settings[1:], strict=True):
        mine, theirs = (suite_source.identity(s.get("source", {})) for s in (first, kept))
        if mine != theirs:
            raise MergeError(f"{inputs[0]} and {folder} are different runs: their suites differ ({mine} vs {theirs})")
        prints, others = first.get("fingerprints", {}), kept.get("fingerprints", {})
        said = []
        for suite in sorted(set(prints) | set(others)):
            old, new = prints.get(suite), others.get(suite)
            if old == new:
                continue
            if old is None or new is None:
                said.append(f"{suite} only in {folder if old is None else inputs[0]}")
            elif isinstance(old, dict) and isinstance(new, dict):
                said.append(f"{suite}: {', '.join(changes(old, {DEFINITION: '', **new}))}")
            else:
                said.append(f"{suite}: its fingerprints differ")
        if said:
            raise MergeError(f"{inputs[0]} and {folder} are different runs: their suites differ ({'; '.join(said)})")


def _read_runs(inputs: list[Path], out: Path) -> list[RunFolder]:
    """Each input opened as a run folder (run_folder.open_run_folder: run.json, its settings, its
    completed blocks); MergeError for an input that is the output, is given twice, is no run
    folder or does not read as one."""
    folders: list[RunFolder] = []
    seen: dict[Path, Path] = {}  # resolved folder -> as given
    for folder in inputs:
        problem = path_problem(folder)
        if problem:
            raise MergeError(problem)
        if folder.resolve() == out.resolve():
            raise MergeError(f"{folder} is both an input and the output")
        if folder.resolve() in seen:
            raise MergeError(f"{seen[folder.resolve()]} and {folder} are the same run folder")
        seen[folder.resolve()] = folder
        if not (folder / state.LOG_FILE).is_file():
            raise MergeError(f"{folder}: no trials.jsonl (not a racecheck run folder)")
        try:
            folders.append(open_run_folder(folder))
        except RunFolderError as exc:
            raise MergeError(str(exc)) from None
    return folders


def _read_records(inputs: list[Path], folders: list[RunFolder]) -> tuple[list[TrialRecord], list[str]]:
    """Every input's records, and a note for each input that holds fewer trials than it planned.
    MergeError for a log that does not read, holds no record of a shard that planned some, or
    holds a trial another input holds too."""
    records: list[TrialRecord] = []
    notes: list[str] = []
    owner: dict[tuple[str, str, int], Path] = {}  # (suite, arm, trial) -> the folder that holds it
    for folder, opened in zip(inputs, folders, strict=True):
        run, kept = opened.run, opened.settings
        bad: list = []
        try:
            mine = list(opened.records(bad_lines=bad))
        except ValueError as exc:  # unreadable, or a line that is not a valid trial record of the run
            raise MergeError(str(exc)) from None
        if bad:
            raise MergeError(
                f"{folder / 'trials.jsonl'}: {bad[0].describe()}; this repairs the log and reruns what it "
                f"lost: {resume_command(folder)}"
            )
        planned = _planned(kept, run)
        held = {(r.scenario, r.arm, r.trial) for r in mine}
        if not mine and planned != 0:
            raise MergeError(
                f"{folder / 'trials.jsonl'} holds no records (shard {_shard(folder, run)} ran no test); "
                f"finish it before the merge: {resume_command(folder)}"
            )
        if planned and len(held) < planned:
            notes.append(
                f"{folder} (shard {_shard(folder, run)}) holds {len(held)} of the {planned} trials it "
                f"planned (trials x arms); the rest are missing from the merge until "
                f"'racecheck run --resume' on the merged folder runs them"
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
    return records, notes


def _planned(settings: dict, run: dict) -> int | None:
    """The blocks (suite, arm, trial) a run planned in its shard; None where run.json does not say."""
    suites = run.get("scenarios")
    if "trials" not in settings or not isinstance(suites, dict):
        return None
    per_arm = len(settings.get("shard", Shard()).trials(settings["trials"]))
    try:
        return sum(len(info["arms"]) for info in suites.values()) * per_arm
    except (KeyError, TypeError):
        return None


def _completed(inputs: list[Path]) -> str:
    """The inputs' completed.jsonl, one after the other."""
    parts = []
    for folder in inputs:
        try:
            text = (folder / state.COMPLETED_FILE).read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise MergeError(f"{folder / state.COMPLETED_FILE}: unreadable: {exc.strerror or exc}") from None
        parts.append(text if not text or text.endswith("\n") else text + "\n")
    return "".join(parts)


def _commit(out: Path, *, records: list[TrialRecord], completed: str, run: dict) -> None:
    """Write the merged files as temporary files of this process, then rename them into place with
    SIGINT and SIGTERM held back, trials.jsonl last: an interrupted merge leaves no trial log
    that could pass for a run (its temporary files are removed on the way out)."""
    texts = {
        state.COMPLETED_FILE: completed,
        state.RUN_FILE: json.dumps(run, indent=2) + "\n",
        "trials.jsonl": "".join(r.to_json() + "\n" for r in records),
    }
    staged = {name: out / f".{name}.{os.getpid()}.{_STAGED}" for name in texts}
    try:
        for name, text in texts.items():
            with open(staged[name], "w", encoding="utf-8") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            for name in texts:  # trials.jsonl last: the file that makes the folder a run
                os.replace(staged[name], out / name)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
    except OSError as exc:
        raise MergeError(f"cannot write to {out}: {exc.strerror or exc}") from None
    finally:
        for path in staged.values():
            path.unlink(missing_ok=True)


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
