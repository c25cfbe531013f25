"""Starting one pytest session for the trial runner, and stopping it for good.

A multi-rank suite is launched with torchrun (`python -m torch.distributed.run`), a one-rank suite
with plain pytest in the environment torchrun would give its one worker (`torchrun --standalone
--nproc-per-node 1`: ranks, sizes, a master address and a free port), so that a suite's own
`dist.init_process_group()` works with its defaults in both cases. The session runs in its own
process group; stopping it kills the whole tree (torchrun starts its workers in sessions of their
own, so a process-group kill alone misses them).
Should the runner itself be killed outright, the session gets SIGTERM from the kernel (lifeline.py).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psutil

from racecheck.runner.lifeline import child_dies_with_us


@dataclasses.dataclass(frozen=True)
class SessionSpec:
    """What one pytest session runs."""

    world_size: int
    pytest_args: tuple[str, ...]  # targets and options for pytest, racecheck's own included
    env: dict
    cwd: Path
    log_path: Path  # combined stdout/stderr of the session
    user_args: tuple[str, ...] = ()  # the suite's own part of pytest_args (for messages)
    rendezvous: tuple[str, ...] = ()  # torchrun's arguments for a world across nodes (nodes.py)


def command(spec: SessionSpec) -> list[str]:
    if spec.world_size > 1 or spec.rendezvous:
        where = list(spec.rendezvous) or ["--standalone", "--nnodes", "1", "--nproc-per-node", str(spec.world_size)]
        launcher = [sys.executable, "-m", "torch.distributed.run", *where, "--monitor-interval", "0.2", "-m", "pytest"]
    else:
        launcher = [sys.executable, "-m", "pytest"]
    return launcher + list(spec.pytest_args)


def start(spec: SessionSpec) -> subprocess.Popen:
    env = {**os.environ, **spec.env, "PYTHONUNBUFFERED": "1"}
    if spec.world_size == 1 and not spec.rendezvous:
        env.update(one_rank_env())
    spec.log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(spec.log_path, "ab") as log:
        return subprocess.Popen(
            command(spec),
            cwd=spec.cwd,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=child_dies_with_us(signal.SIGTERM),
        )


def one_rank_env() -> dict[str, str]:
    """What torchrun's agent sets for the one worker of `--standalone --nproc-per-node 1`, less
    the agent's own store (there is no agent: the process group's store is the rank's own)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))  # a free port, as torchrun picks one
        port = s.getsockname()[1]
    ones = ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE")
    zeros = ("RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS")
    return {
        **dict.fromkeys(ones, "1"),
        **dict.fromkeys(zeros, "0"),
        "ROLE_NAME": "default",
        "MASTER_ADDR": "localhost",
        "MASTER_PORT": str(port),
        "TORCHELASTIC_RUN_ID": f"racecheck-{port}",
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
    }


def kill_tree(proc: subprocess.Popen, *, grace: float = 3.0) -> None:
    """Terminate the session and every descendant (SIGTERM, then SIGKILL after `grace` seconds)."""
    kill_process_tree(proc.pid, grace=grace)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass


def kill_process_tree(pid: int, *, grace: float = 3.0) -> None:
    """kill_tree for a process that is not our child (a session a killed runner left behind)."""
    try:
        root = psutil.Process(pid)
        family = root.children(recursive=True) + [root]
    except psutil.NoSuchProcess:
        return
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
