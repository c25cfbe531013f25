"""A run folder as every command reads it: `report`, `gate`, `merge` and `run --resume` open it
with open_run_folder, so that a spoiled folder gets the same one line (exit 2) from each of them.

What a folder must be to be read:

- a path the file system can look up (path_problem: not a name longer than it allows, not behind
  a folder that cannot be searched);
- `run.json` a JSON object whose settings read back (run_json.settings_from_json: `"chunk": 0`
  does not), whose `attempts` are objects with whole trial counts, and whose `skipped` suites
  are described as the runner writes them. A folder without one is read by `report` and `gate`
  (a bare trial log), which then know no plan to hold its trials to;
- `completed.jsonl`, where there is one, a file whose blocks lie within the plan;
- `trials.jsonl`'s records each valid (protocol/records.TrialRecord.from_dict) and within the plan.

The plan: a trial index lies below the largest trial count that the run and each of its attempts
had (a resume may lower `--trials`; the trials it ran before stay in the log). A record past it
(`"trial": 10**30`) would be tallied as a trial of its own that no test row shows.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path

from racecheck.protocol.records import TrialRecord
from racecheck.runner import state
from racecheck.runner.run_json import settings_from_json
from racecheck.runner.trial_log import BadLine, read_log


class RunFolderError(ValueError):
    """A run folder that cannot be read as a run: one line naming the file and what is wrong."""


@dataclasses.dataclass(frozen=True)
class RunFolder:
    """An opened run folder: its run.json as written (`{}` where it has none), its settings as
    read back, and its finished blocks (state.read_completed)."""

    path: Path
    run: dict
    settings: dict
    completed: dict

    @property
    def planned_trials(self) -> int | None:
        """The trial count that bounds the folder's trial indices; None where run.json says none."""
        counts = [self.settings["trials"]] if "trials" in self.settings else []
        counts += [a["trials"] for a in self.run.get("attempts", []) if "trials" in a]
        return max(counts, default=None)

    def records(self, *, bad_lines: list[BadLine] | None = None) -> Iterator[TrialRecord]:
        """The log's records, each valid and within the plan (trial_log.read_log)."""
        return read_log(self.path / state.LOG_FILE, bad_lines=bad_lines, trials=self.planned_trials)


def open_run_folder(out: str | os.PathLike, *, need_run: bool = True) -> RunFolder:
    """The run folder at `out`, checked as the module docstring says; RunFolderError (one line)
    for a path or a file that is not as a run writes it. `need_run`: refuse a folder without
    run.json (merge and --resume need its settings); else read it as one without a plan."""
    path = Path(out)
    problem = path_problem(path)
    if problem:
        raise RunFolderError(problem)
    try:
        run = state.read_run(path) if need_run or (path / state.RUN_FILE).exists() else {}
    except ValueError as exc:  # it names the file
        raise RunFolderError(str(exc)) from None
    try:
        settings = settings_from_json(run)
    except ValueError as exc:  # `run.json: chunk: 0 is below 1`
        raise RunFolderError(f"{path}: {exc}") from None
    _check_attempts(path, run.get("attempts", []))
    _check_skipped(path, run.get("skipped") or {})
    completed = path / state.COMPLETED_FILE
    if completed.exists() and not completed.is_file():
        raise RunFolderError(f"{completed}: not a file")
    folder = RunFolder(path, run, settings, {})
    try:
        done = state.read_completed(path, trials=folder.planned_trials)
    except ValueError as exc:
        raise RunFolderError(str(exc)) from None
    return dataclasses.replace(folder, completed=done)


def _check_attempts(path: Path, attempts) -> None:
    """run.json's `attempts`: a list of objects, each with a whole trial count of 1 or more."""
    where = f"{path / state.RUN_FILE}: attempts"
    if not isinstance(attempts, list) or not all(isinstance(a, dict) for a in attempts):
        raise RunFolderError(f"{where}: not a list of objects")
    for a in attempts:
        trials = a.get("trials", 1)
        if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
            raise RunFolderError(f"{where}: trials {trials!r} is not a whole number of at least 1")


def _check_skipped(path: Path, skipped) -> None:
    """run.json's `skipped`: {suite: {"arms": [...], "why": "...", "expect": {arm: ...}}}."""
    where = f"{path / state.RUN_FILE}: skipped"
    if not isinstance(skipped, dict):
        raise RunFolderError(f"{where}: not an object")
    for suite, info in skipped.items():
        if (
            not isinstance(info, dict)
            or not isinstance(info.get("why"), str)
            or not isinstance(info.get("arms"), list)
            or not all(isinstance(a, str) for a in info["arms"])
            or not isinstance(info.get("expect", {}), dict)
        ):
            raise RunFolderError(f"{where}: {suite!r} is not described by its arms and why it was skipped")


def path_problem(path: Path) -> str | None:
    """Why the file system cannot even look `path` up (a name or a path longer than it allows,
    also below folders that do not exist yet; a folder on the way that cannot be searched), in one
    line; None where it can, whether or not the path exists."""
    name_max, path_max = _limits(path)
    longest = max((len(os.fsencode(part)) for part in path.parts), default=0)
    if longest > name_max:
        return f"{_short(path)}: a name of {longest} bytes, longer than the file system allows ({name_max})"
    if len(os.fsencode(os.path.abspath(path))) >= path_max:
        return f"{_short(path)}: a path longer than the file system allows ({path_max} bytes)"
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        return f"{_short(path)}: {exc.strerror or exc}"
    return None


def _limits(path: Path) -> tuple[int, int]:
    """The longest name and path of the file system that holds `path` (of its nearest folder that
    exists), as pathconf says; Linux's 255 and 4096 where it cannot say."""
    known = next((p for p in Path(os.path.abspath(path)).parents if os.path.isdir(p)), Path("/"))
    try:
        return os.pathconf(known, "PC_NAME_MAX"), os.pathconf(known, "PC_PATH_MAX")
    except (OSError, ValueError):
        return 255, 4096


def _short(path: Path) -> str:
    text = str(path)
    return text if len(text) <= 60 else f"{text[:40]}...{text[-12:]}"
