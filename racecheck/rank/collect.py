"""What a pytest session under the trial runner never collects: a racecheck run folder (one that
holds `runner.lock`, which a run or a merge takes before it writes anything else), other than the
one the session itself runs in.

A run folder inside the project (the default `--out`, or any `--out` there) holds a git arm's
worktree, a copy of the project's tests at another revision, under OUT/worktrees/; an env arm's
session that collects from the project's root (no `tests =`) would collect that copy beside the
working tree's tests, and so would a run killed before it removed its worktrees leave one for
every later run. Ignoring every run folder rather than passing pytest `--ignore` for this run's
keeps both out, and follows the rule by which the suite's fingerprint (suites/fingerprint.py)
leaves run folders out: the tests a run tallies and the files it fingerprints are the same. The
git arm's own session runs inside this run's folder (its worktree): a folder that holds the
session's working folder is never ignored.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from racecheck.protocol.names import LOCK_NAME


class RunFolders:
    """The plugin object of a session under the runner (plugin.py registers it)."""

    def __init__(self, invocation_dir: Path) -> None:
        self.invocation_dir = Path(invocation_dir).resolve()

    @pytest.hookimpl
    def pytest_ignore_collect(self, collection_path: Path, config: pytest.Config) -> bool | None:
        if not (collection_path / LOCK_NAME).is_file():
            return None  # not a run folder (a file, or a folder of the project): pytest decides
        if self.invocation_dir.is_relative_to(collection_path.resolve()):
            return None  # the folder this session runs in: a git arm's worktree is inside it
        return True
