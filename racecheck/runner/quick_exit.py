"""`python -m racecheck.runner.quick_exit MODULE ARGS`: `python -m MODULE ARGS` (torchrun's agent,
a rank's pytest), then an exit that skips the interpreter's teardown.

When MODULE returns or exits, the work of a session's process is done: its outcomes are in the
rank log, pytest or torchrun has run its own cleanups. What normal interpreter shutdown would
still do is unload every module torch brought in and collect their objects, about 0.6 CPU-seconds
per process on the CPU machine (a quarter of what a rank of a short session costs) and nothing a
run keeps. So the process ends as it would have, less that teardown: threads that are not
daemons are waited for, `atexit` handlers run (a suite's own, multiprocessing's, logging's flush),
standard output and error are flushed, and the exit status is the module's. An exception other
than SystemExit takes Python's own way out (traceback, full shutdown).
"""

from __future__ import annotations

import atexit
import os
import runpy
import sys
import threading


def run_module(module: str, args: list[str]) -> int:
    """Run `module` as `python -m module args` would; its exit status."""
    sys.argv[1:] = args
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            return stop.code or 0
        print(stop.code, file=sys.stderr)  # what Python does with sys.exit("message")
        return 1
    return 0


def exit_now(code: int) -> None:
    """End the process as the interpreter would at exit, less its teardown of modules."""
    for thread in threading.enumerate():  # the interpreter waits for these before atexit
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or a broken pipe: nothing left to say there
            pass
    os._exit(code)


if __name__ == "__main__":
    exit_now(run_module(sys.argv[1], sys.argv[2:]))
