"""Where a run folder lies and what in it is the run's own: the default `--out` (a new folder,
made atomically, under the project's `racecheck-out/`), and the checks that keep every write of a
run inside its folder and out of its files (a symbolic link among them, a report's output path
that names one).

[Note: run folder paths] A run's folder is absolute from the moment the run is defined
(RunConfig.out), so every path the runner hands to a session (its schedule, its ranks' logs, its
stop file, the hand-off points) names the same file whatever folder the session runs in: the
suite's root, or a git arm's worktree. The default `--out` of a
project's suite is anchored at the project (the folder of its config file, as pytest anchors its
cache at its rootdir), so `racecheck run` from a subfolder writes where it does from the root; the
catalogue's default, and an explicit relative `--out`, are relative to the working folder.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from racecheck.runner.state import COMPLETED_FILE, LOCK_FILE, LOCK_NAME, RUN_FILE

DEFAULT_PARENT = "racecheck-out"
# What a run or a merge writes into its folder: the files of its state and records, and the
# folders of its sessions (ranks/, logs/), git arms (worktrees/), hand-off points (handoffs/) and
# follower nodes (nodes/), and its control trials (control/). No command writes a report over one
# of them.
OWN_FILES = {
    "trials.jsonl": "the run's trial log",
    "trials.jsonl.rejected": "the run's rejected log lines",
    COMPLETED_FILE: "the run's list of finished trials",
    RUN_FILE: "the run's definition",
    LOCK_FILE: "the run's runner identity",
    LOCK_NAME: "the run's lock",
    "summary.csv": "the run's summary",
}
OWN_FOLDERS = ("ranks", "logs", "worktrees", "handoffs", "nodes", "control")


def absolute(path: Path | str) -> Path:
    """`path` made absolute against the working folder, `..` folded, symbolic links kept (a
    link's own name stays the one the user gave)."""
    return Path(os.path.abspath(path))


def default_parent(config_file: Path | None) -> Path:
    """Where the default run folders go: `racecheck-out/` in the folder of a project's config
    file (the project's root), or in the working folder for the catalogue."""
    anchor = config_file.parent if config_file is not None else Path.cwd()
    return absolute(anchor / DEFAULT_PARENT)


def run_name() -> str:
    """The name of a default run folder started now, to the second."""
    return time.strftime("run-%Y%m%d-%H%M%S")


def new_run_folder(parent: Path) -> Path:
    """Create a new, empty run folder under `parent` and return it: `run-YYYYMMDD-HHMMSS`, or with
    `-2`, `-3`, ... when a run started in the same second took that name. The folder is made by
    one mkdir, which fails where the name exists, so two runs never get one folder. OSError when
    `parent` cannot be created or written."""
    parent.mkdir(parents=True, exist_ok=True)
    name = run_name()
    for n in range(1, 10_000):
        folder = parent / (name if n == 1 else f"{name}-{n}")
        try:
            folder.mkdir()
        except FileExistsError:
            continue
        return folder
    raise FileExistsError(f"{parent} holds 9999 run folders named {name}[-N]")


def own_file(out: Path, path: Path) -> str | None:
    """What `path` is to the run in `out` when it is one of the run's own files (OWN_FILES, or a
    file under one of OWN_FOLDERS), reached by any name (a relative path, `..`, a symbolic link,
    a hard link); None when writing `path` leaves the run as it was."""
    folder, target = Path(out).resolve(), Path(path).resolve()
    if target.parent == folder and target.name in OWN_FILES:
        return OWN_FILES[target.name]
    inside = target.relative_to(folder).parts if target.is_relative_to(folder) else ()
    if inside and inside[0] in OWN_FOLDERS:
        return f"a file of the run's {inside[0]}/ folder"
    try:
        written = os.stat(target)
    except OSError:
        return None
    for name, what in OWN_FILES.items():
        try:
            if os.path.samestat(written, os.stat(folder / name)):
                return what
        except OSError:
            continue
    return None


def linked_entry(out: Path) -> str | None:
    """A one-line reason when one of the run's own files or folders in `out`, or anything below
    those folders (but inside a git worktree, whose links are the project's), is a symbolic link:
    a run would write through it into a file outside its folder. None when there is none."""
    out = Path(out)
    for name in (*OWN_FILES, *OWN_FOLDERS):
        if (out / name).is_symlink():
            return _linked(out / name)
    for name in OWN_FOLDERS:
        for top, folders, files in os.walk(out / name):
            here = Path(top)
            for entry in folders + files:
                if (here / entry).is_symlink():
                    return _linked(here / entry)
            if here == out / "worktrees":
                folders[:] = []  # each a checkout of the project: its own links are the project's
    return None


def _linked(path: Path) -> str:
    return f"{path} is a symbolic link (to {os.readlink(path)}); a run writes only into files of its own folder"
