"""Node ranks 1..N-1 of a world across nodes: run the writer's sessions' local part and forward
their ranks' outcome events (see [Note: nodes] in nodes.py).

A follower plans nothing and writes no trial log: its run folder (OUT/nodes/node-R) holds its
run.json (so that `--resume` finds its settings), its rank logs and its session logs.
"""

from __future__ import annotations

import dataclasses
import socket
import time
from typing import TYPE_CHECKING

from racecheck.exitcodes import InputError
from racecheck.protocol.schedule import block_from_json
from racecheck.runner import interrupts, launch, state
from racecheck.runner.blocks import SessionPlan
from racecheck.runner.nodes import (
    POLL_S,
    Heartbeat,
    Liveness,
    NodeError,
    NodeSpec,
    connect,
    definition,
    fetch,
    key,
    put,
)
from racecheck.runner.ranks import RankTail
from racecheck.runner.session import crash_signature

if TYPE_CHECKING:
    from torch.distributed import TCPStore


class Follower:
    """Follows the writer's sessions until it says the run is over."""

    def __init__(self, spec: NodeSpec, config, *, note=lambda line: None) -> None:
        assert not spec.is_writer
        self.spec = spec
        self.config = config
        self.note = note
        self.sessions = 0
        self._store: TCPStore | None = None
        self._liveness: Liveness | None = None
        self._heartbeat: Heartbeat | None = None

    def run(self) -> None:
        """NodeError when the writer cannot be reached or is lost; InputError when it refuses this
        node's settings or ends the run with an error."""
        from racecheck.runner.trial_runner import Runner

        self._write_run_json()
        try:
            self._store = connect(self.spec, timeout=self.spec.join_timeout)
        except (OSError, RuntimeError) as exc:  # torch raises DistStoreError (a RuntimeError)
            raise NodeError(
                f"could not reach node 0 at {self.spec.host}:{self.spec.port} within "
                f"{self.spec.join_timeout:g} s ({str(exc).splitlines()[0]})"
            ) from None
        self._heartbeat = Heartbeat(self.spec)
        self._liveness = Liveness(self.spec, self._store, [0])
        runner = Runner(self.config)  # builds this node's session specs; runs nothing itself
        try:
            put(
                self.store,
                key(self.spec, "hello", self.spec.node_rank),
                {"definition": definition(self.config), "host": socket.gethostname()},
            )
            welcome = self._wait(key(self.spec, "welcome", self.spec.node_rank))
            if welcome.get("error"):
                raise InputError(welcome["error"])
            while True:
                plan = self._wait(key(self.spec, "session", self.sessions + 1))
                if plan.get("done"):
                    put(self.store, key(self.spec, "bye", self.spec.node_rank), 1)
                    if plan.get("error"):
                        raise NodeError(f"node 0 ended the run: {plan['error']}")
                    return
                self.sessions += 1
                self._session(runner, plan)
        except RuntimeError as exc:  # the connection to the writer's store broke
            raise NodeError(f"lost node 0: {str(exc).splitlines()[0]}") from None
        finally:
            runner.worktrees.cleanup()
            self._heartbeat.stop()

    def _write_run_json(self) -> None:
        out = self.config.out
        out.mkdir(parents=True, exist_ok=True)
        data = {**self.config.to_json(), "node": {"rank": self.spec.node_rank, "nnodes": self.spec.nnodes}}
        state.write_run(out, data)

    @property
    def store(self) -> TCPStore:
        assert self._store is not None, "connected at the start of run()"
        return self._store

    def _writer_alive(self) -> None:
        """NodeError once the writer is gone (its store unreachable, or its heartbeat stopped)."""
        assert self._heartbeat is not None and self._liveness is not None, "both start in run()"
        if self._heartbeat.failed:
            raise NodeError("lost node 0: its store can no longer be reached")
        for _, quiet in self._liveness.lost():
            raise NodeError(f"lost node 0: no heartbeat for {quiet:.0f} s")

    def _wait(self, name: str) -> dict:
        while True:
            value = fetch(self.store, name)
            if value is not None:
                return value
            self._writer_alive()
            time.sleep(POLL_S)
            interrupts.check()

    def _session(self, runner, plan: dict) -> None:
        sid = plan["sid"]
        suite = next(s for s in self.config.scenarios if s.name == plan["suite"])
        blocks = SessionPlan(tuple(block_from_json(b) for b in plan["blocks"]))
        spec = runner.session_spec(suite, blocks, sid)
        spec = dataclasses.replace(spec, rendezvous=self.spec.torchrun_args(sid, spec.world_size))
        ranks = self.config.out / "ranks"
        tails: dict = {}
        stop_seen = False
        proc = launch.start(spec)
        try:  # a broken store connection ends the run (Follower.run); first, stop our part
            while proc.poll() is None:
                self._forward(sid, ranks, tails)
                if fetch(self.store, key(self.spec, "over", sid)) is not None:
                    break  # node 0's part ended: ours cannot go on alone
                stop = fetch(self.store, key(self.spec, "stop", sid)) if not stop_seen else None
                if stop is not None:
                    (ranks / f"{sid}.stop").write_text(str(stop))  # the plugin's graceful stop
                    stop_seen = True
                self._writer_alive()
                time.sleep(POLL_S)
                interrupts.check()
        finally:
            if proc.poll() is None:
                launch.kill_tree(proc)
            launch.finish(proc)
        self._forward(sid, ranks, tails)
        for tail in tails.values():
            tail.close()
        code = proc.returncode
        put(
            self.store,
            key(self.spec, "ended", sid, self.spec.node_rank),
            {"returncode": code, "signature": crash_signature(code, spec.log_path) if code else ""},
        )

    def _forward(self, sid: str, ranks, tails: dict) -> None:
        """Send the events this node's ranks appended since the last call, as one batch."""
        batch = {}
        for path in sorted(ranks.glob(f"{sid}-rank-*.jsonl")):
            events = tails.setdefault(path, RankTail(path)).read()
            if events:  # relayed in the rank log's own schema (protocol/rank_events.RankEvent)
                batch[path.name] = [e.to_dict() for e in events]
        if batch:
            index = self.store.add(key(self.spec, "events", sid, self.spec.node_rank, "next"), 1) - 1
            put(self.store, key(self.spec, "events", sid, self.spec.node_rank, index), batch)
            # The count goes up only once the batch is stored: the writer reads batches below it.
            self.store.add(key(self.spec, "events", sid, self.spec.node_rank, "n"), 1)
