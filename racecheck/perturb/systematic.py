"""The systematic schedule of patch mode: one delayed hand-off per trial, with a stated bound.

Trial 0 of each test (per arm and rank) delays nothing and records the distinct hand-off points
the test passes, in the order it first passes them: a point is its kind (racecheck.perturb.points:
stream_enter, before_stream_wait and stream_wait, event_record and after_event_record, before_*
and after_* of the collectives: both sides of every hand-off, racecheck.perturb.handoffs), the
code location that reached it (the first frame outside torch and racecheck) and the stream it
hands work to, named by first appearance in the test (`default`, `s1`, `s2`, ...), so that the
key is the same in every trial and process:

    stream_enter@model/fsdp.py:212/s1

Trial t = 1..k, k the number of points, delays point t alone, at every time the test passes it;
trials k+1 .. k+k(k-1)/2 delay each pair (i, j), i < j, in order (unless pairs=0); later trials
start over. So a race that one delayed hand-off exposes is found within k trials, one that needs
two within k + k(k-1)/2. The enumeration is kept in the run folder (HandoffStore), so that it
reaches the later trials of the same session and those of later sessions (a resumed run too).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import types
from pathlib import Path

_SKIP_DIRS: tuple[str, ...] = ()  # filled on first use: torch's and racecheck's own folders


def selection(trial: int, k: int, *, pairs: bool) -> tuple[int, ...]:
    """The 0-based indices of the points trial `trial` delays (() for the recording trial 0)."""
    if trial <= 0 or k <= 0:
        return ()
    combos: list[tuple[int, ...]] = [(i,) for i in range(k)]
    if pairs:
        combos += [(i, j) for i in range(k) for j in range(i + 1, k)]
    return combos[(trial - 1) % len(combos)]


def coverage(k: int, trials: int, *, pairs: bool) -> str:
    """What `trials` trials (0 .. trials-1) cover of k points, as one line of the run's output."""
    if k == 0:
        return "systematic: k=0 points: the test passed no hand-off point, nothing to delay"
    ran = max(trials - 1, 0)  # trial 0 records
    points = f"k={k} points (before and after each hand-off)"
    if ran < k:
        return (
            f"systematic: {points}, singles covered only in trials 1..{ran} ({ran} of {k}); "
            f"run {k + 1} trials to cover every single point"
        )
    line = f"systematic: {points}, all singles covered in trials 1..{k}"
    total_pairs = k * (k - 1) // 2
    if pairs and total_pairs:
        done = min(ran - k, total_pairs)
        if done == total_pairs:
            line += f", all {total_pairs} pairs in trials {k + 1}..{k + total_pairs}"
        elif done:
            line += f", {done} of {total_pairs} pairs in trials {k + 1}..{k + done}"
    return line


def location() -> str:
    """FILE:LINE of the innermost frame outside torch, racecheck and the standard library's
    contextlib/functools: the code that reached the hand-off point."""
    global _SKIP_DIRS
    if not _SKIP_DIRS:
        import torch

        import racecheck

        _SKIP_DIRS = (
            os.path.dirname(torch.__file__) + os.sep,
            os.path.dirname(racecheck.__file__) + os.sep,
            os.path.dirname(os.__file__) + os.sep + "contextlib.py",
            os.path.dirname(os.__file__) + os.sep + "functools.py",
        )
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_SKIP_DIRS):
        frame = frame.f_back
    if frame is None:
        return "?:0"
    return f"{short_path(frame.f_code.co_filename)}:{frame.f_lineno}"


@functools.cache  # it runs at every hand-off point; a code file's name is its key
def short_path(path: str) -> str:
    """A path that is the same on every machine: below site-packages (or dist-packages), else
    below the working folder (the project root; a git arm's worktree is its run's working folder),
    else below the first sys.path entry that holds it, as an import finds it (a `pip install
    --target` folder on PYTHONPATH), else as it is."""
    for marker in (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep):
        if marker in path:
            return path.split(marker, 1)[1]
    absolute = os.path.abspath(path)
    for entry in [os.getcwd(), *(os.path.abspath(e or os.curdir) for e in sys.path)]:
        prefix = entry.rstrip(os.sep) + os.sep
        if prefix != os.sep and absolute.startswith(prefix):
            return absolute[len(prefix) :]
    return path


def handoff_key(point: str, where: str, stream: str) -> str:
    return f"{point}@{where}/{stream}"


class HandoffStore:
    """The enumerations of a run: one JSON file per (arm, test, rank) under OUT/handoffs."""

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = Path(folder)

    def _path(self, arm: str, test: str, rank: int) -> Path:
        digest = hashlib.blake2b(f"{arm}\0{test}".encode(), digest_size=8).hexdigest()
        return self.folder / f"{digest}-rank{rank}.json"

    def load(self, arm: str, test: str, rank: int) -> list[str] | None:
        """The recorded keys, or None when trial 0 of this test has not recorded them yet."""
        try:
            data = json.loads(self._path(arm, test, rank).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return [str(k) for k in data.get("points", [])]

    def save(self, arm: str, test: str, rank: int, keys: list[str]) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self._path(arm, test, rank)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"arm": arm, "test": test, "rank": rank, "points": keys}) + "\n")
        tmp.replace(path)  # atomic: a later session never reads half a file

    def counts(self) -> dict[tuple[str, str], int]:
        """(arm, test) -> k, the most points any rank recorded."""
        out: dict[tuple[str, str], int] = {}
        for path in sorted(self.folder.glob("*-rank*.json")):
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            key = (data.get("arm", ""), data.get("test", ""))
            out[key] = max(out.get(key, 0), len(data.get("points", [])))
        return out
