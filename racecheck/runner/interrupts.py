"""Ctrl-C and SIGTERM during a run: both stop it at once, and neither can be lost.

Python raises KeyboardInterrupt wherever the main thread happens to be when the signal is handled;
if that is inside a finalizer (a file or a subprocess being collected), the exception is printed
as "ignored" and the run goes on as if nothing happened. `handled()` therefore installs one
handler for both signals that also records the request, and the session loop calls `check()` at
every poll, which raises again for a request whose exception was swallowed.
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
