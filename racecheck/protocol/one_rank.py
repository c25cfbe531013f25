"""The environment of a one-rank session, which the runner gives it (runner/launch.py) and each of
its pytest-xdist workers adjusts (rank/plugin.py).

A one-rank suite runs without torchrun in the environment torchrun's agent gives the one worker of
`torchrun --standalone --nproc-per-node 1` (ranks, sizes, a master address and a free port), less
the agent's own store: there is no agent, so the process group's store is the rank's own, hosted
on MASTER_PORT by the first `init_process_group`. Under pytest-xdist every worker is such a rank,
a world of one of its own, and workers sharing one port would each try to host their store on it
(EADDRINUSE): each takes a free port of its own before any test runs.
"""

from __future__ import annotations

import os
import socket
from collections.abc import MutableMapping

from racecheck.protocol.names import ONE_RANK_VAR

_ONES = ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE")
_ZEROS = ("RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS")


def free_port() -> int:
    """A TCP port free on this machine now, as torchrun picks one."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rendezvous(port: int) -> dict[str, str]:
    return {"MASTER_PORT": str(port), "TORCHELASTIC_RUN_ID": f"racecheck-{port}"}


def one_rank_env() -> dict[str, str]:
    """What torchrun's agent sets for the one worker of `--standalone --nproc-per-node 1`, less
    the agent's own store, and the mark that says a session has it."""
    return {
        **dict.fromkeys(_ONES, "1"),
        **dict.fromkeys(_ZEROS, "0"),
        "ROLE_NAME": "default",
        "MASTER_ADDR": "localhost",
        **_rendezvous(free_port()),
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
        ONE_RANK_VAR: "1",
    }


def own_world_for_xdist_worker(environ: MutableMapping[str, str] = os.environ) -> bool:
    """In a pytest-xdist worker of a one-rank session: a port of its own (its own rendezvous id
    too), so that its `init_process_group` hosts a store no other worker does. Whether it did."""
    if not environ.get(ONE_RANK_VAR) or not environ.get("PYTEST_XDIST_WORKER"):
        return False
    environ.update(_rendezvous(free_port()))
    return True
