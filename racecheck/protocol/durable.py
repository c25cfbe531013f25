"""Append-only files that their writer can always read back: the runner's trial log and record of
finished blocks (runner/trial_log.TrialLog, runner/state.CompletedLog) and the rank log each process
of a session writes (rank/rank_log.RankLog) go through AppendFile.

An AppendFile is held open, for reading as well as appending, for as long as it is written: an
open file's data lives on when its name is removed, so a run folder that a test deletes under the
run can be written again from the files held (restore; runner/held_folder.py for the runner's,
RankLog for a rank's). Every append lands whole or not at all: where the file system refuses part
of it (a full disk, a quota, a file-size limit), what did land is taken back, so the file never
ends in a torn line, and the error is raised. With `sync`, each append is fsynced too (a SIGKILL, even of
the machine, loses no finished outcome).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

_COPY = 1024 * 1024


def names(path: Path, fd: int) -> bool:
    """Whether `path` leads to the file open as `fd` (not when it was removed or replaced)."""
    try:
        named = os.stat(path)
    except OSError:
        return False
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


class AppendFile:
    """One append-only file, held open until close()."""

    def __init__(self, path: str | os.PathLike, *, sync: bool = True) -> None:
        self.path = Path(path)
        self.sync = sync
        self._fd = self._open(self.path)

    @staticmethod
    def _open(path: Path) -> int:
        path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)

    def append(self, data: bytes) -> None:
        """Write `data` at the end, whole (and fsynced), or raise OSError with the file as it was."""
        end = os.fstat(self._fd).st_size
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view) :]
            if self.sync:
                os.fsync(self._fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, end)
            raise

    def gone(self) -> bool:
        """Whether the file's name no longer leads to this file (removed, or replaced)."""
        return not names(self.path, self._fd)

    def restore(self) -> int:
        """Write the file again under its name from what is held open, and hold the new one;
        the bytes written. OSError where it cannot be written."""
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.restore")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        new = os.open(tmp, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            offset = 0
            while chunk := os.pread(self._fd, _COPY, offset):
                view = memoryview(chunk)
                while view:
                    view = view[os.write(new, view) :]
                offset += len(chunk)
            if self.sync:
                os.fsync(new)
            os.replace(tmp, self.path)
        except OSError:
            os.close(new)
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        os.close(self._fd)
        self._fd = new
        return offset

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
