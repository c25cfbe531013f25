"""A session's log, bounded: what every process of a pytest session prints (pytest's report, its
tracebacks, a test's own output) reaches the runner through one pipe and is kept once, in
OUT/logs/session-SID.log, as it arrives.

Past HEAD_BYTES, the log keeps only the latest output: once more than 2 x TAIL_BYTES have come
after the head, the part between is cut and the cut is said where it was made
(`[... 49.2 MB cut ...]`); when the session is over, the log is its first HEAD_BYTES, that line,
and its last TAIL_BYTES (from a line's start, where one is near). A test that prints without end costs neither
the disk nor the runner's memory more than that, and both ends that tell what happened (pytest's
start and collection, the last traceback, torchrun's exit codes) are kept.

The pipe is drained whatever happens to the file (a full disk, a folder removed under the run):
a session never blocks on its output. A process that outlives its session and still holds the
pipe (one that left the session's tree, group and mark) is read for a short grace, then no more.
"""

from __future__ import annotations

import os
import select
import threading
from pathlib import Path

HEAD_BYTES = 2 * 1024 * 1024
TAIL_BYTES = 2 * 1024 * 1024
_CHUNK = 64 * 1024
_ALIGN = 4096  # how far into the kept tail a line may begin for the tail to begin with it
_DRAIN_CHUNKS = 64  # chunks read once the session is over, of what its leftovers still write


def size_text(n: int) -> str:
    """`49.2 MB`: a byte count in decimal units, as `du -h --si` and file managers give it."""
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


class SessionLog:
    """The log of one session: `writer` is the pipe end that the session's processes write to
    (their stdout and stderr); `close()` once the session is over (see the module docstring)."""

    def __init__(self, path: Path, *, head: int = HEAD_BYTES, tail: int = TAIL_BYTES) -> None:
        self.path = path
        self.head, self.tail = head, tail
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "ab", buffering=0)
        self._reader, self.writer = os.pipe()
        self._head_left = head
        self._head_end = 0  # the file's size once the head is in
        self._after = bytearray()  # what came after the head and is kept, in memory as on disk
        self._cut = 0  # bytes cut between the head and what is kept after it
        self._writable = True
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._pump, name=f"racecheck-log-{path.name}", daemon=True)
        self._thread.start()

    def release_writer(self) -> None:
        """Once the session is started (its processes hold the writing end): close the runner's
        copy, so that the pipe ends when they do."""
        os.close(self.writer)

    def close(self, *, grace: float = 1.0) -> None:
        """Read what is left in the pipe (at most `grace` seconds once the session's processes
        are gone), then leave the log as the module docstring says."""
        self._thread.join(timeout=grace)
        self._stop.set()
        self._thread.join()
        os.close(self._reader)
        if len(self._after) > self.tail:
            self._trim()
        self._file.close()

    def _pump(self) -> None:
        left_after_stop = _DRAIN_CHUNKS  # what a leftover writes on after the session is not read
        while left_after_stop:
            stopping = self._stop.is_set()
            ready, _, _ = select.select([self._reader], [], [], 0 if stopping else 0.1)
            if not ready:
                if stopping:
                    return  # all that was written before the stop is in
                continue
            chunk = os.read(self._reader, _CHUNK)
            if not chunk:
                return  # every writer is gone
            self._keep(chunk)
            if stopping:
                left_after_stop -= 1

    def _keep(self, chunk: bytes) -> None:
        if self._head_left > 0:
            part, chunk = chunk[: self._head_left], chunk[self._head_left :]
            self._head_left -= len(part)
            self._write(part)
            if self._head_left == 0 and self._writable:
                self._head_end = self._file.tell()
        if chunk:
            self._after += chunk
            self._write(chunk)
            if len(self._after) > 2 * self.tail:
                self._trim()

    def _trim(self) -> None:
        """Keep the last `tail` bytes after the head, from the start of a line where one begins
        near their start, and say in the log what was cut."""
        start = len(self._after) - self.tail
        if self._after[start - 1 : start] != b"\n":  # not at a line's start: go to the next one
            newline = self._after.find(b"\n", start, start + _ALIGN)
            if 0 <= newline < len(self._after) - 1:
                start = newline + 1
        kept = self._after[start:]
        self._cut += len(self._after) - len(kept)
        self._after = bytearray(kept)
        if self._writable:
            try:
                self._file.truncate(self._head_end)
                self._file.seek(self._head_end)
            except OSError:
                self._writable = False
        self._write(f"\n[... {size_text(self._cut)} cut ...]\n".encode() + kept)

    def _write(self, data: bytes) -> None:
        if not self._writable:
            return
        try:
            self._file.write(data)
        except OSError:  # a full disk, a removed folder: the runner's own writes report it
            self._writable = False
