"""A rank's log: the rank events (protocol/rank_events.py) one pytest process writes, each the
moment it happens, for the runner to read as they come (runner/ranks.py's RankTail).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from racecheck.protocol.durable import AppendFile
from racecheck.protocol.rank_events import RankEvent


class RankLog:
    """One pytest process's rank log: one RankEvent per line, stamped with the process (`RANK`,
    the xdist worker) and the time, written at once. `{rank}` in the pattern becomes the rank; an
    xdist worker adds its id to the name. The file is opened at the first write, so an xdist
    controller, which runs no test, leaves none. Should its name be removed under the session (a
    test deleting the run folder), the next write puts the whole file back under it first
    (durable.AppendFile.restore), and the runner reads on there (ranks.RankTail)."""

    def __init__(self, pattern: str) -> None:
        rank = os.environ.get("RANK", "0")
        self.worker = os.environ.get("PYTEST_XDIST_WORKER", "")
        path = Path(pattern.replace("{rank}", rank))
        if self.worker:  # every xdist worker writes its own file; a worker is not a rank
            path = path.with_name(f"{path.stem}-{self.worker}{path.suffix}")
        self.path = path
        self.rank = int(rank)
        self._file: AppendFile | None = None  # opened at the first event

    def write(self, event: RankEvent) -> None:
        if self._file is None:
            self._file = AppendFile(self.path, sync=False)
        elif self._file.gone():  # a test removed the run folder: the runner reads on (RankTail)
            self._file.restore()
        event.rank, event.worker = self.rank, self.worker
        event.time = time.time()
        self._file.append((event.to_json() + "\n").encode("utf-8"))
