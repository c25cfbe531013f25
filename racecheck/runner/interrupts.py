"""Ctrl-C and SIGTERM during a run or a merge: both stop it at once, and neither can be lost.

Python raises KeyboardInterrupt wherever the main thread happens to be when the signal is handled;
if that is inside a finalizer (a file or a subprocess being collected), the exception is printed
as "ignored" and the run goes on as if nothing happened. `handled()` therefore installs one
handler for both signals that also records the request, and the session loop calls `check()` at
every poll, which raises again for a request whose exception was swallowed.

A command holds `handled()` from its start to its last line, the table and summary.csv included:
a signal that lands after the work (a merge after its commit, a run while it prints its table)
still ends the command with its message and exit 130, never with the default's silent 143. What
the command then writes on its way out (the summary of the trials it kept) runs `ignored()`: a
second signal is the same request, and the summary is written whole.
"""

from __future__ import annotations

import contextlib
import signal
import threading

_requested = threading.Event()
_SIGNALS = (signal.SIGINT, signal.SIGTERM)  # SIGTERM: a cancelled CI job cleans up too


def _handler(signum, frame):
    _requested.set()
    raise KeyboardInterrupt


@contextlib.contextmanager
def handled():
    """Within: SIGINT and SIGTERM interrupt the run (see the module docstring)."""
    _requested.clear()
    previous = [(s, signal.signal(s, _handler)) for s in _SIGNALS]
    try:
        yield
    finally:
        for s, handler in previous:
            signal.signal(s, handler)
        _requested.clear()


def check() -> None:
    """Raise KeyboardInterrupt if an interrupt was requested (its own exception may have been lost)."""
    if _requested.is_set():
        raise KeyboardInterrupt


@contextlib.contextmanager
def ignored():
    """Within: SIGINT and SIGTERM do nothing (a command's last writes once it was interrupted)."""
    previous = [(s, signal.signal(s, signal.SIG_IGN)) for s in _SIGNALS]
    try:
        yield
    finally:
        for s, handler in previous:
            signal.signal(s, handler)
