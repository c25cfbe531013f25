"""Where a run's suites came from (RunConfig.source, kept in run.json), told apart from what they
are, so that a run is tied to its suite and not to the folder the suite was checked out in.

A source names its suites by kind (`config`: a project's config file; `catalogue`: scenarios of
a catalogue folder, by name) and by place: the absolute path where the run started, and the same
place relative to the run folder (`from_out`). A resumed run looks first beside its folder, so a
project moved or copied with its run folder resumes from where it lies now, and falls back on the
absolute path for a run folder that moved alone (a CI artifact). What the suites are is the kind,
the names and their fingerprints (suites/fingerprint.py), which `merge` compares: shards of one
suite from checkouts at different paths are one run.
"""

from __future__ import annotations

import os
from pathlib import Path

# The key of each kind that holds its place.
_PLACE = {"config": "path", "catalogue": "dir"}


def kept(source: dict, out: Path) -> dict:
    """`source` as run.json keeps it for a run in the folder `out`: its place also relative to
    that folder."""
    key = _PLACE.get(source.get("kind", ""))
    if key is None or not isinstance(source.get(key), str):
        return dict(source)
    return {**source, "from_out": os.path.relpath(source[key], out)}


def located(source: dict, out: Path) -> dict:
    """The source run.json kept for the run folder `out`, with the place its suites lie at now:
    beside the folder (`from_out`) where that exists, else the absolute path it was kept with."""
    key = _PLACE.get(source.get("kind", ""))
    near = source.get("from_out")
    placed = without_from_out(source)
    if key is not None and isinstance(near, str):
        here = os.path.normpath(Path(out).absolute() / near)
        if os.path.exists(here):
            placed[key] = here
    return placed


def without_from_out(source: dict) -> dict:
    """The source as a run holds it (RunConfig.source): its place relative to a run folder is
    run.json's alone, made anew for each folder it is written to (kept)."""
    return {k: v for k, v in source.items() if k != "from_out"}


def identity(source: dict) -> dict:
    """What a source says of its suites without their place: its kind and names."""
    return {k: v for k, v in source.items() if k not in (*_PLACE.values(), "from_out")}
