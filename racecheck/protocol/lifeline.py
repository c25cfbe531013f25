"""Tying a process's life to its parent's, so that no session outlives the runner that started it.

A runner killed with SIGKILL runs no cleanup: its pytest or torchrun session would live on as an
orphan, holding GPUs and ports, past any --timeout. On Linux the kernel can deliver a signal to a
process when its parent dies (prctl PR_SET_PDEATHSIG); the runner asks for it in the session it
starts (SIGTERM, so that torchrun stops its workers in turn) and the plugin asks for it in every
rank and pytest-xdist worker (SIGKILL: their parent is the launcher, already gone or going).
Elsewhere this does nothing, and the runner's own cleanup stays the only guard.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM, *, parent: int | None = None) -> bool:
    """Have the kernel send `sig` to this process when its parent exits; True where it was set.
    `parent` is the pid the caller expects as its parent: should that one already be gone (it
    died between fork and this call), the process exits now, as the signal would have made it."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if parent is not None and os.getppid() != parent:
        os._exit(128 + int(sig))
    return True


def child_dies_with_us(sig: int = signal.SIGTERM):
    """A `preexec_fn` for subprocess.Popen: the child gets `sig` when this process exits."""
    me = os.getpid()
    return lambda: die_with_parent(sig, parent=me)
