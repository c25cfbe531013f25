"""Git-revision arms: the suite runs in a worktree checked out at the arm's revision.

A revision is resolved to its commit once, when the run starts (run.json keeps it, so a resumed
run tests the same commit even if the branch moved). Each commit gets one detached worktree under
OUT/worktrees/, created on first use, reused by every session of every arm at that commit (and by
a resumed run), and removed when the run ends; no other session collects it (rank/collect.py
leaves every run folder out). Inside it the suite runs from the same relative folder as in the
checkout, with that folder (and its `src/`, if any) first on PYTHONPATH, so the revision's own
code is imported even when the project is installed in editable mode.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from racecheck.exitcodes import InfrastructureError, InputError


def _git(*args: str, cwd: Path) -> str:
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    except FileNotFoundError:
        raise InputError("a git-revision arm needs git, which is not installed") from None
    except subprocess.TimeoutExpired:
        raise InfrastructureError(f"git {' '.join(args)} took over 120 s") from None
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        raise _GitFailed(lines[-1] if lines else f"git {args[0]} failed")
    return done.stdout.strip()


class _GitFailed(Exception):
    """A git command failed; its message is git's last line of output."""


def toplevel(folder: Path) -> Path:
    try:
        return Path(_git("rev-parse", "--show-toplevel", cwd=folder))
    except _GitFailed:
        raise InputError(f"{folder} is not inside a git repository, so it has no revisions to check out") from None


def resolve(folder: Path, revision: str) -> str:
    """The commit `revision` names in the repository holding `folder`; InputError if none."""
    top = toplevel(folder)
    try:
        return _git("rev-parse", "--verify", "--quiet", "--end-of-options", f"{revision}^{{commit}}", cwd=top)
    except _GitFailed:
        raise InputError(f"unknown git revision {revision!r} in {top}") from None


class Worktrees:
    """The worktrees of one run, one per commit, under `folder`."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._made: dict[tuple[Path, str], Path] = {}

    def cwd_for(self, suite_root: Path, commit: str) -> Path:
        """Where the suite runs at `commit`: its folder inside the commit's worktree."""
        top = toplevel(suite_root)
        tree = self._ensure(top, commit)
        return tree / suite_root.resolve().relative_to(top.resolve())

    def _ensure(self, top: Path, commit: str) -> Path:
        key = (top, commit)
        if key in self._made:
            return self._made[key]
        tree = (self.folder / commit[:12]).resolve()
        try:
            if tree.is_dir() and _git("rev-parse", "HEAD", cwd=tree) == commit:
                self._made[key] = tree  # left by an interrupted run: reuse it
                return tree
        except _GitFailed:
            pass
        try:
            if tree.exists():
                _git("worktree", "remove", "--force", str(tree), cwd=top)
            _git("worktree", "prune", cwd=top)
            self.folder.mkdir(parents=True, exist_ok=True)
            _git("worktree", "add", "--detach", "--force", str(tree), commit, cwd=top)
        except _GitFailed as exc:
            raise InfrastructureError(f"could not check out {commit[:12]} in {tree}: {exc}") from None
        self._made[key] = tree
        return tree

    def cleanup(self) -> None:
        """Remove every worktree this run made or reused (and git's record of it)."""
        for (top, _), tree in list(self._made.items()):
            try:
                _git("worktree", "remove", "--force", str(tree), cwd=top)
                _git("worktree", "prune", cwd=top)
            except (_GitFailed, InfrastructureError, InputError):
                pass
        self._made.clear()
        try:
            self.folder.rmdir()
        except OSError:
            pass


def pythonpath(cwd: Path, inherited: str | None) -> str:
    """PYTHONPATH for a session in a worktree: the revision's folder (and src/) first."""
    parts = [str(cwd)] + ([str(cwd / "src")] if (cwd / "src").is_dir() else [])
    return ":".join(parts + ([inherited] if inherited else []))
