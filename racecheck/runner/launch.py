"""Starting one pytest session for the trial runner, and stopping it for good.

A multi-rank suite is launched with torchrun (`python -m torch.distributed.run`), a one-rank suite
without it in the environment torchrun would give its one worker (protocol/one_rank.py), so that a suite's own
`dist.init_process_group()` works with its defaults in both cases. torchrun's agent and each
rank run through quick_exit.py, which ends the process without unloading torch once the module
has returned.

Stopping a session kills all it started: its process tree (torchrun starts its workers in sessions
of their own, so a process-group kill alone misses them), its process group (children whose
parent died), and every process that carries the session's mark in its environment
(RACECHECK_SESSION_MARK), which catches a daemon a test started with `setsid` or a double fork
even after it left the tree and the group; `finish` kills such leftovers after a session that
ended by itself too. A process that clears its environment and leaves the group escapes all
three; a container or a cgroup around the whole run (`systemd-run --scope`) contains it. Should
the runner itself be killed outright, the session gets SIGTERM from the kernel (protocol/lifeline.py).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import psutil

from racecheck.protocol.lifeline import child_dies_with_us
from racecheck.protocol.names import SESSION_MARK_VAR
from racecheck.protocol.one_rank import one_rank_env
from racecheck.runner.session_log import SessionLog

QUICK_EXIT = "racecheck.runner.quick_exit"  # `-m MODULE`, then an exit without the interpreter's teardown
_marks: dict[int, str] = {}  # a running session's pid -> the mark in its processes' environment
_logs: dict[int, SessionLog] = {}  # a running session's pid -> its log, until finish()


@dataclasses.dataclass(frozen=True)
class SessionSpec:
    """What one pytest session runs."""

    world_size: int
    pytest_args: tuple[str, ...]  # targets and options for pytest, racecheck's own included
    env: dict
    cwd: Path
    log_path: Path  # combined stdout/stderr of the session, bounded (session_log.py)
    user_args: tuple[str, ...] = ()  # the suite's own part of pytest_args (for messages)
    rendezvous: tuple[str, ...] = ()  # torchrun's arguments for a world across nodes (nodes.py)


def command(spec: SessionSpec) -> list[str]:
    if spec.world_size > 1 or spec.rendezvous:
        where = list(spec.rendezvous) or ["--standalone", "--nnodes", "1", "--nproc-per-node", str(spec.world_size)]
        torchrun = [sys.executable, "-m", QUICK_EXIT, "torch.distributed.run"]
        launcher = [*torchrun, *where, "--monitor-interval", "0.2", "-m", QUICK_EXIT, "pytest"]
    else:
        launcher = [sys.executable, "-m", QUICK_EXIT, "pytest"]
    return launcher + list(spec.pytest_args)


def start(spec: SessionSpec) -> subprocess.Popen:
    mark = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
    env = {**os.environ, **spec.env, "PYTHONUNBUFFERED": "1", SESSION_MARK_VAR: mark}
    if spec.world_size == 1 and not spec.rendezvous:
        env.update(one_rank_env())
    log = SessionLog(spec.log_path)  # the session's output, kept once and bounded
    try:
        proc = subprocess.Popen(
            command(spec),
            cwd=spec.cwd,
            env=env,
            stdout=log.writer,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=child_dies_with_us(signal.SIGTERM),
        )
    except BaseException:
        log.release_writer()
        log.close(grace=0)
        raise
    log.release_writer()
    _marks[proc.pid] = mark
    _logs[proc.pid] = log
    return proc


def kill_tree(proc: subprocess.Popen, *, grace: float = 3.0) -> None:
    """Terminate the session and all it started (SIGTERM, then SIGKILL after `grace` seconds)."""
    kill_process_tree(proc.pid, grace=grace, mark=_marks.get(proc.pid))
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass


def finish(proc: subprocess.Popen, *, grace: float = 1.0) -> None:
    """Once a session is over, however it ended: kill what it left running (a test's daemon),
    and complete its log (session_log.py), which is then whole for readers."""
    mark = _marks.pop(proc.pid, None)
    if mark is not None:
        _terminate(_marked(mark, pgid=None), grace=grace)
    log = _logs.pop(proc.pid, None)
    if log is not None:
        log.close(grace=grace)


def kill_process_tree(pid: int, *, grace: float = 3.0, mark: str | None = None) -> None:
    """kill_tree for a process that is not our child (a session a killed runner left behind):
    its tree, its process group, and with `mark` every process carrying it."""
    try:
        root = psutil.Process(pid)
        family = root.children(recursive=True) + [root]
    except psutil.NoSuchProcess:
        return
    known = {p.pid for p in family}
    family += [p for p in _marked(mark, pgid=pid) if p.pid not in known]
    _terminate(family, grace=grace)


def _marked(mark: str | None, *, pgid: int | None) -> list[psutil.Process]:
    """The processes in process group `pgid` or with `mark` in their environment, this one excepted."""
    found = []
    for p in psutil.process_iter():
        if p.pid == os.getpid():
            continue
        try:
            if (pgid is not None and os.getpgid(p.pid) == pgid) or (mark and p.environ().get(SESSION_MARK_VAR) == mark):
                found.append(p)
        except (psutil.Error, OSError):  # gone, a zombie, or another user's
            continue
    return found


def _terminate(family: list[psutil.Process], *, grace: float) -> None:
    for p in family:
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(family, timeout=grace)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=grace)
