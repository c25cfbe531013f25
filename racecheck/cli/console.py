"""A console that may close under a command: `racecheck run ... 2>&1 | head -2` closes the pipe
after two lines, and every later write raises BrokenPipeError. A run must not stop for that: its
trials, trials.jsonl and summary.csv matter more than the lines nobody reads any more.

`surviving_closed_console()` puts sys.stdout and sys.stderr behind streams that, at the first
write or flush the operating system refuses, point the file descriptor at /dev/null (so that
later writes, the interpreter's last flush and C++ code writing to the descriptor all succeed
unseen) and drop what they are given from then on. The command then ends as it would have, with
its own exit code.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator


class _Closable:
    """A text stream's stand-in that survives the stream's reader going away."""

    def __init__(self, stream) -> None:
        self._stream = stream
        self.closed_under_us = False

    def write(self, text: str) -> int:
        if self.closed_under_us:
            return len(text)
        try:
            return self._stream.write(text)
        except OSError:  # BrokenPipeError, EIO from a terminal that went away
            self._silence()
            return len(text)

    def flush(self) -> None:
        if self.closed_under_us:
            return
        try:
            self._stream.flush()
        except OSError:
            self._silence()

    def _silence(self) -> None:
        self.closed_under_us = True
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


@contextlib.contextmanager
def surviving_closed_console() -> Iterator[None]:
    """Within: a console that closes costs its output, never the command (see the module)."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _Closable(sys.stdout), _Closable(sys.stderr)
    try:
        yield
    finally:
        for stand_in in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stand_in.flush()
        sys.stdout, sys.stderr = saved
