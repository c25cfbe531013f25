"""Worlds across nodes: the settings every node shares, torchrun's rendezvous arguments, and the
key-value channel between the nodes' racecheck processes.

[Note: nodes] Every node runs the same `racecheck run ... --nnodes N --node-rank R
--rdzv-endpoint HOST:PORT`. A session's world is started on each node by torchrun, whose ranks
meet through torchrun's own c10d rendezvous; racecheck adds only what a trial run needs on top:
- Node rank 0 is the writer (node_writer.py). It runs the trial runner exactly as on one node
  (plans the sessions, writes trials.jsonl, completed.jsonl, run.json) and, for the whole run,
  hosts a TCPStore at the rendezvous endpoint. Every session's torchrun, on every node, joins the
  c10d rendezvous on that store as a client (`is_host=false`), under a rendezvous id of its own
  (`RDZV_ID-SESSION`), so that one session's rendezvous never meets another's keys. torchrun's
  rank 0 agent still starts a fresh store of its own for the workers' process group.
- Nodes 1..N-1 are followers (node_follower.py). They plan nothing: for each session the writer
  publishes, they start their part of the world and forward their ranks' outcome events through
  the store. The writer appends those events to its own ranks/ folder under the ranks' own file
  names, so session.py merges every rank's outcome as if all ranks were local. Followers keep
  their rank and session logs in OUT/nodes/node-R. A node's rank and its ranks' global ranks
  are unrelated: c10d orders the torchrun agents by host and pid, so node 1 may hold rank 0.
- Liveness: every node adds to a heartbeat counter once a second. A node whose counter stands
  still for c10d's own keep-alive window (keep_alive_interval x keep_alive_max_attempt, 15 s by
  default) is lost: the writer ends the session in flight (its test becomes `crash`, naming the
  node) and stops the run cleanly (exit 3; `--resume` on every node continues it). A follower that
  loses the writer kills its part and exits 3.
- A node that never joins: the writer waits torchrun's join_timeout (600 s by default) for every
  follower's hello, then exits 3 naming the nodes missing.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import socket
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch.distributed import TCPStore

BEAT_S = 1.0
POLL_S = 0.05
_KEEP_ALIVE = {"keep_alive_interval": 5, "keep_alive_max_attempt": 3}  # c10d's defaults
_JOIN_TIMEOUT = 600  # torchrun's default join_timeout


class NodeError(Exception):
    """A node is lost, never joined, or runs another experiment (the message says which)."""


@dataclasses.dataclass(frozen=True)
class NodeSpec:
    """This node's place in a world across nodes (the --nnodes ... options)."""

    nnodes: int
    node_rank: int
    host: str
    port: int
    rdzv_id: str = "racecheck"
    rdzv_conf: tuple[tuple[str, str], ...] = ()  # torchrun's --rdzv-conf, passed through

    @property
    def conf(self) -> dict:
        return dict(self.rdzv_conf)

    @property
    def is_writer(self) -> bool:
        return self.node_rank == 0

    @property
    def join_timeout(self) -> float:
        return float(self.conf.get("join_timeout", _JOIN_TIMEOUT))

    @property
    def lost_after(self) -> float:
        """Seconds without a heartbeat after which a node is lost (c10d's keep-alive window)."""
        conf = {**_KEEP_ALIVE, **{k: int(v) for k, v in self.conf.items() if k in _KEEP_ALIVE}}
        return float(max(conf["keep_alive_interval"] * conf["keep_alive_max_attempt"], 2 * BEAT_S))

    def torchrun_args(self, session_id: str, world_size: int) -> tuple[str, ...]:
        """torchrun's arguments for one session's part of the world on this node (the same on
        every node: c10d ranks the nodes itself, so torchrun takes no node rank)."""
        conf = ",".join(f"{k}={v}" for k, v in (*self.rdzv_conf, ("is_host", "false")))
        return (
            "--nnodes",
            str(self.nnodes),
            "--nproc-per-node",
            str(world_size // self.nnodes),
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"{self.host}:{self.port}",
            "--rdzv-id",
            f"{self.rdzv_id}-{session_id}",
            "--rdzv-conf",
            conf,
            "--max-restarts",
            "0",
        )


def definition(config) -> dict:
    """What every node's run must agree on: the experiment, without the paths that may differ
    between machines and the settings only the writer uses (trials, timeout, stop rules)."""
    data = config.to_json()
    source = data.pop("source", {})
    data["source"] = {"kind": source.get("kind"), "names": source.get("names")}
    for key in ("trials", "timeout", "shard_source"):
        data.pop(key, None)
    return data


def parse_endpoint(text: str) -> tuple[str, int]:
    """(host, port) of HOST:PORT; ValueError (one line) for another form."""
    host, sep, port = (text or "").rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536 or any(c.isspace() for c in host):
        raise ValueError(f"{text!r} is not HOST:PORT (node 0's address and a port, e.g. 10.0.0.1:29500)")
    return host, int(port)


def check_resolves(host: str, port: int) -> None:
    """ValueError (one line) for a host that no name service knows, so that no node waits for a
    rendezvous that cannot be."""
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        reason = exc.strerror if isinstance(exc, socket.gaierror) else str(exc)
        raise ValueError(f"{host}:{port}: cannot resolve the host {host!r} ({reason})") from None


def check_hostable(spec: NodeSpec, *, timeout: float = 5.0) -> None:
    """On node 0, before it hosts the store: the port is free and HOST:PORT leads back to this
    machine (a listener of our own answers within `timeout`). ValueError (one line) otherwise:
    torch's store would retry for its whole timeout and then print a C++ backtrace."""
    family = socket.AF_INET6 if socket.has_dualstack_ipv6() else socket.AF_INET
    try:
        server = socket.create_server(("", spec.port), family=family, dualstack_ipv6=family == socket.AF_INET6)
    except OSError as exc:
        raise ValueError(f"cannot host the rendezvous on port {spec.port}: {exc.strerror or exc}") from None
    with server:
        try:
            socket.create_connection((spec.host, spec.port), timeout=timeout).close()
        except OSError as exc:
            raise ValueError(
                f"{spec.host}:{spec.port} does not lead to this machine ({exc.strerror or exc}), and node 0 "
                "hosts the rendezvous: give node 0's own address"
            ) from None


def parse_conf(text: str) -> tuple[tuple[str, str], ...]:
    """torchrun's --rdzv-conf K=V,...; ValueError (one line) for what torchrun would not take, or
    for is_host, which racecheck sets (node 0 hosts the store)."""
    pairs = []
    for item in filter(None, (p.strip() for p in (text or "").split(","))):
        key, eq, value = (part.strip() for part in item.partition("="))
        if not eq or not key:
            raise ValueError(f"{item!r} is not KEY=VALUE")
        if key == "is_host":
            raise ValueError("is_host is racecheck's to set (node rank 0 hosts the store)")
        if key in ("join_timeout", *_KEEP_ALIVE) and not value.isdigit():
            raise ValueError(f"{key}={value!r} is not a whole number of seconds")
        pairs.append((key, value))
    return tuple(pairs)


# -- the channel: keys in the writer's store ------------------------------------------------------
def key(spec: NodeSpec, *parts) -> str:
    return "/".join(["racecheck", spec.rdzv_id, *map(str, parts)])


def connect(spec: NodeSpec, *, master: bool = False, timeout: float = 30.0) -> TCPStore:
    """A connection to the writer's store (or, with master, the store itself). A client first
    waits, at most `timeout` seconds, for the port to accept connections (OSError past that), so
    that a writer still starting is no error and torch's store logs no failed attempts."""
    TCPStore = _store_class()
    if not master:
        deadline = time.monotonic() + timeout
        while True:
            try:
                socket.create_connection((spec.host, spec.port), timeout=max(deadline - time.monotonic(), 0.1)).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    return TCPStore(
        spec.host, spec.port, is_master=master, wait_for_workers=False, timeout=datetime.timedelta(seconds=timeout)
    )


def _store_class() -> type[TCPStore]:
    """torch's TCPStore. The first import of torch in this process happens with torch's C++ log
    set to errors only (it reads the level once, at load): a lost node is then reported once, by
    racecheck, not as a C++ backtrace for every store call that fails. The sessions' processes
    keep the log level they would have had."""
    import os
    import sys

    if "torch" not in sys.modules and "TORCH_CPP_LOG_LEVEL" not in os.environ:
        os.environ["TORCH_CPP_LOG_LEVEL"] = "ERROR"
        try:
            import torch.distributed  # noqa: F401
        finally:
            del os.environ["TORCH_CPP_LOG_LEVEL"]
    from torch.distributed import TCPStore

    return TCPStore


def put(store: TCPStore, name: str, value) -> None:
    store.set(name, json.dumps(value))


def fetch(store: TCPStore, name: str):
    """The JSON value at `name`, or None while it is not set (never blocks)."""
    if not store.check([name]):
        return None
    return json.loads(store.get(name))


class Heartbeat:
    """Adds to this node's beat counter every BEAT_S seconds, on a connection of its own, until
    stopped; `failed` is set when the store can no longer be reached (the writer is gone)."""

    def __init__(self, spec: NodeSpec, *, timeout: float = 30.0) -> None:
        self._store = connect(spec, timeout=timeout)
        self._key = key(spec, "beat", spec.node_rank)
        self._stop = threading.Event()
        self.failed = False
        self._thread = threading.Thread(target=self._run, name="racecheck-heartbeat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._store.add(self._key, 1)
            except Exception:  # noqa: BLE001 - any store error means the writer is unreachable
                self.failed = True
                return
            self._stop.wait(BEAT_S)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2 * BEAT_S)


class Liveness:
    """Watches other nodes' beat counters; a node is lost once its counter stood still for
    `lost_after` seconds (measured on this machine's clock, so clocks need not agree)."""

    def __init__(self, spec: NodeSpec, store, nodes) -> None:
        self.spec, self.store = spec, store
        now = time.monotonic()
        self._seen = {n: (-1, now) for n in nodes}

    def lost(self) -> list[tuple[int, float]]:
        """(node, seconds since its last beat) of every node lost by now."""
        now = time.monotonic()
        gone = []
        for node, (count, since) in self._seen.items():
            value = self.store.add(key(self.spec, "beat", node), 0)
            if value != count:
                self._seen[node] = (value, now)
            elif now - since > self.spec.lost_after:
                gone.append((node, now - since))
        return gone

    def forget(self, node: int) -> None:
        self._seen.pop(node, None)
