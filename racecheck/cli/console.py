"""The console racecheck writes to, and the lines it says there.

A console may close under a command: `racecheck run ... 2>&1 | head -2` closes the pipe after two
lines, and every later write raises BrokenPipeError. A run must not stop for that: its trials,
trials.jsonl and summary.csv matter more than the lines nobody reads any more.
`surviving_closed_console()` puts sys.stdout and sys.stderr behind streams that, at the first
write or flush the operating system refuses, point the file descriptor at /dev/null (so that
later writes, the interpreter's last flush and C++ code writing to the descriptor all succeed
unseen) and drop what they are given from then on. The command then ends as it would have, with
its own exit code, unless the write was refused by a disk (full, over quota, a file-size limit:
`racecheck report OUT > table.md`): what the command printed is then incomplete, which `main`
says in one line with exit 3 (`refused()`).

A console may also be closed before the command starts (`racecheck run >&-`): its descriptor is
opened on /dev/null first, or the first file racecheck opened would take its number and receive
what a child or C++ code writes to the console.

`say()` writes one of racecheck's own lines (an error, a warning, an interruption): one line
whatever it quotes, a folder whose name holds a line break included.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from collections.abc import Iterator

import click

_DISK_REFUSALS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


def say(line: str) -> None:
    """`line` on stderr as one line: a line break it quotes (a path may hold one) written `\\n`."""
    click.echo(line.replace("\r", "\\r").replace("\n", "\\n"), err=True)


class _Closable:
    """A text stream's stand-in that survives the stream's reader going away."""

    def __init__(self, stream, name: str) -> None:
        self._stream = stream
        self.name = name
        self.closed_under_us = False
        self.refused: OSError | None = None  # the disk's refusal, where a disk refused it

    def write(self, text: str) -> int:
        if self.closed_under_us:
            return len(text)
        try:
            return self._stream.write(text)
        except OSError as exc:  # BrokenPipeError, EIO from a terminal that went away, a full disk
            self._silence(exc)
            return len(text)

    def flush(self) -> None:
        if self.closed_under_us:
            return
        try:
            self._stream.flush()
        except OSError as exc:
            self._silence(exc)

    def _silence(self, exc: OSError) -> None:
        self.closed_under_us = True
        if exc.errno in _DISK_REFUSALS:
            self.refused = exc
        try:
            fd = self._stream.fileno()
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, fd)
            os.close(devnull)
        except (OSError, ValueError, AttributeError):  # no descriptor (a test's StringIO)
            pass
        with contextlib.suppress(OSError, ValueError):
            self._stream.flush()  # what the stream still holds goes to /dev/null

    def __getattr__(self, name: str):  # isatty, fileno, encoding, errors, buffer, ...
        return getattr(self._stream, name)


class Console:
    """The two stand-ins of a command's console."""

    def __init__(self, out: _Closable, err: _Closable) -> None:
        self.streams = (out, err)

    def refused(self) -> str:
        """'standard output: No space left on device' where a disk refused a write, else ''."""
        for stream in self.streams:
            if stream.refused is not None:
                return f"{stream.name}: {stream.refused.strerror or stream.refused}"
        return ""


def _open_standard_descriptors() -> None:
    """Descriptors 0, 1 and 2 that the shell closed, opened on /dev/null (see the module)."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            devnull = os.open(os.devnull, os.O_RDWR)
            if devnull != fd:
                os.dup2(devnull, fd)
                os.close(devnull)


@contextlib.contextmanager
def surviving_closed_console() -> Iterator[Console]:
    """Within: a console that closes costs its output, never the command (see the module)."""
    _open_standard_descriptors()
    saved = sys.stdout, sys.stderr
    # Python has no stream where a descriptor was closed at its start: nobody reads there.
    out = saved[0] if saved[0] is not None else open(os.devnull, "w")  # noqa: SIM115 - held to the end
    err = saved[1] if saved[1] is not None else open(os.devnull, "w")  # noqa: SIM115
    console = Console(_Closable(out, "standard output"), _Closable(err, "standard error"))
    sys.stdout, sys.stderr = console.streams
    try:
        yield console
    finally:
        for stand_in in console.streams:
            with contextlib.suppress(Exception):
                stand_in.flush()
        sys.stdout, sys.stderr = saved
