"""Where a run folder lies: its path, made absolute once, and the default `--out` (a new folder,
made atomically, under the project's `racecheck-out/`).

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

DEFAULT_PARENT = "racecheck-out"


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
