"""`python signal_at.py TARGET WHEN [ENDING] -- RACECHECK_ARGS`: `racecheck RACECHECK_ARGS`, with a
SIGTERM that the process sends itself each time TARGET is called (`before` or `after` the call),
or only each time one of the call's arguments ends with ENDING.

A signal sent at a point the code reaches, not after a sleep, so that a test of what a late
signal leaves behind (a merge after its commit, a run while it writes its table) is the same on a
loaded machine and an idle one. TARGET is `MODULE.NAME`, e.g. `os.replace` or
`racecheck.results.tally.write_summary`.
"""

from __future__ import annotations

import functools
import importlib
import os
import signal
import sys


def signal_at(target: str, when: str, ending: str = "") -> None:
    module_name, name = target.rsplit(".", 1)
    module = importlib.import_module(module_name)
    real = getattr(module, name)

    @functools.wraps(real)
    def wrapper(*args, **kwargs):
        matched = not ending or any(str(a).endswith(ending) for a in args)
        if matched and when == "before":
            os.kill(os.getpid(), signal.SIGTERM)
        result = real(*args, **kwargs)
        if matched and when == "after":
            os.kill(os.getpid(), signal.SIGTERM)
        return result

    setattr(module, name, wrapper)


if __name__ == "__main__":
    split = sys.argv.index("--")
    signal_at(*sys.argv[1:split])
    from racecheck.cli import main

    sys.argv = ["racecheck", *sys.argv[split + 1 :]]
    main()
