"""What a suite is made of, as digests that run.json keeps, so that `--resume` can tell that the
suite changed since the run started: its new trials would run other tests, or the same tests
changed, and one tally would mix the two.

A suite's fingerprint maps `[definition]` to a digest of its racecheck settings (arms, targets,
pytest arguments, world sizes, default profile) and each test file, by its path relative to the
suite's root, to a digest of its bytes. The test files are the run's targets (every `*.py` below a
folder target; the file of a node id), or without targets pytest's default test files below the
root (`test_*.py`, `*_test.py`), and the conftest.py files from each target's folder up to the
root. A suite whose arms all run at git revisions takes its tests from those commits (pinned in
run.json), so its working tree's files do not count.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

from racecheck.suites.catalogue import Suite

DEFINITION = "[definition]"
# Folders no test file of the suite lives in: caches, environments, and run folders (whose git
# worktrees are checkouts of the suite's own repository).
_SKIP_FOLDERS = {"__pycache__", "node_modules", "racecheck-out", "site-packages"}


def fingerprint(suite: Suite, targets: tuple[str, ...] = ()) -> dict[str, str]:
    """The suite's fingerprint (see the module docstring); `targets`: the run's own pytest targets
    (after `--`), which replace the suite's."""
    definition = {
        "name": suite.name,
        "world_size": suite.world_size,
        "min_world_size": suite.min_world_size,
        **({"power_of_two_world": True} if suite.power_of_two_world else {}),  # absent: as before the key
        "default_perturb": suite.default_perturb,
        "default_arms": list(suite.default_arms),
        "tests": list(suite.tests),
        "pytest_args": list(suite.pytest_args),
        "arms": {name: dataclasses.asdict(arm) for name, arm in suite.arms.items()},
    }
    digests = {DEFINITION: _digest(json.dumps(definition, sort_keys=True, default=str).encode())}
    if suite.arms and all(arm.git for arm in suite.arms.values()):
        return digests
    root = suite.run_root
    for path in sorted(set(_test_files(root, targets or suite.targets))):
        try:
            digests[path.relative_to(root).as_posix()] = _digest(path.read_bytes())
        except (OSError, ValueError):
            continue  # unreadable, or outside the root: pytest's to report
    return digests


def changes(old: dict, new: dict[str, str], *, most: int = 3) -> list[str]:
    """What differs between two fingerprints of one suite, e.g. `test_io.py changed`,
    `tests/test_new.py added` (at most `most` files named, then how many more)."""
    said = []
    if old.get(DEFINITION) != new[DEFINITION]:
        said.append("its definition ([tool.racecheck] or scenario.toml) changed")
    files = sorted((set(old) | set(new)) - {DEFINITION})
    moved = [
        f"{name} {'added' if name not in old else 'removed' if name not in new else 'changed'}"
        for name in files
        if old.get(name) != new.get(name)
    ]
    if len(moved) > most:
        moved = moved[:most] + [f"{len(moved) - most} more file(s)"]
    return said + moved


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def _test_files(root: Path, targets: tuple[str, ...]) -> Iterator[Path]:
    if not targets:
        yield from (p for p in _python_files(root) if p.name.startswith("test_") or p.stem.endswith("_test"))
        yield from (p for p in _python_files(root) if p.name == "conftest.py")
        return
    for target in targets:
        path = root / target.split("::", 1)[0]
        if path.is_dir():
            yield from _python_files(path)
        elif path.is_file():
            yield path
        folder = path if path.is_dir() else path.parent
        while True:  # the conftest.py files pytest loads for this target
            if (folder / "conftest.py").is_file():
                yield folder / "conftest.py"
            if folder == root or root not in folder.parents:
                break
            folder = folder.parent


def _python_files(top: Path) -> Iterator[Path]:
    for folder, subfolders, files in os.walk(top):
        here = Path(folder)
        subfolders[:] = sorted(
            name
            for name in subfolders
            if not name.startswith(".")
            and name not in _SKIP_FOLDERS
            and not (here / name / "pyvenv.cfg").exists()  # a virtual environment
            and not (here / name / ".git").exists()  # a nested checkout or git worktree
            and not (here / name / "runner.lock").exists()  # a run folder
        )
        yield from (here / name for name in sorted(files) if name.endswith(".py"))
