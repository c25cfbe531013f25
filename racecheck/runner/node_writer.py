"""Node rank 0 of a world across nodes: hosts the store, admits the other nodes, publishes each
session's plan, and brings the other nodes' outcome events into its own run folder
(see [Note: nodes] in nodes.py).

The runner calls `session()` for every session it starts; session.py polls the returned
SessionPeers, which relays the followers' events into OUT/ranks/ and reports a follower whose part
of the world crashed or that stopped responding.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

from racecheck.exitcodes import InputError
from racecheck.protocol.schedule import block_to_json
from racecheck.runner.nodes import (
    POLL_S,
    Heartbeat,
    Liveness,
    NodeError,
    NodeSpec,
    check_hostable,
    connect,
    definition,
    fetch,
    key,
    put,
)

if TYPE_CHECKING:
    from torch.distributed import TCPStore

BYE_S = 5.0  # how long the writer waits at the end for the followers to see that the run is over


class Writer:
    """The writer's side of the channel, for one run. `lost` says why the run cannot go on."""

    def __init__(self, spec: NodeSpec, config) -> None:
        assert spec.is_writer
        self.spec = spec
        self.config = config
        self.followers = tuple(range(1, spec.nnodes))
        self.lost = ""  # e.g. "node 1 stopped responding (no heartbeat for 15 s)"
        self.gone: set[int] = set()
        self.joined: set[int] = set()
        self._store: TCPStore | None = None
        self._heartbeat: Heartbeat | None = None
        self.liveness: Liveness | None = None  # from start() on
        self._sessions = 0

    @property
    def store(self) -> TCPStore:
        assert self._store is not None, "the store exists from start() to close()"
        return self._store

    @property
    def live(self) -> Liveness:
        assert self.liveness is not None, "sessions start after start() admitted the followers"
        return self.liveness

    def start(self) -> None:
        """Host the store and wait for every follower's hello (at most join_timeout). InputError
        (exit 2) when the endpoint cannot be hosted here."""
        try:
            check_hostable(self.spec)
        except ValueError as exc:
            raise InputError(f"--rdzv-endpoint: {exc}") from None
        try:
            self._store = connect(self.spec, master=True, timeout=max(self.spec.join_timeout, 30.0))
        except (RuntimeError, ValueError) as exc:
            raise NodeError(
                f"cannot host the rendezvous at {self.spec.host}:{self.spec.port}: {str(exc).splitlines()[0]}"
            ) from None
        self._heartbeat = Heartbeat(self.spec)
        mine = definition(self.config)
        waiting = set(self.followers)
        deadline = time.monotonic() + self.spec.join_timeout
        while waiting:
            for node in sorted(waiting):
                hello = fetch(self._store, key(self.spec, "hello", node))
                if hello is None:
                    continue
                waiting.discard(node)
                self.joined.add(node)
                differs = difference(mine, hello.get("definition", {}))
                error = f"node {node} runs another experiment than node 0: {differs}" if differs else ""
                put(self._store, key(self.spec, "welcome", node), {"error": error})
                if error:
                    raise InputError(error)
            if waiting and time.monotonic() > deadline:
                names = ", ".join(map(str, sorted(waiting)))
                raise NodeError(
                    f"node{'s' if len(waiting) > 1 else ''} {names} of {self.spec.nnodes} did not "
                    f"join within {self.spec.join_timeout:g} s (--rdzv-conf join_timeout)"
                )
            time.sleep(POLL_S)
        self.liveness = Liveness(self.spec, self._store, self.followers)

    def session(self, session_id: str, suite: str, plan) -> SessionPeers:
        """Publish a session's plan to the followers; the returned peers follow their part."""
        self._sessions += 1
        put(
            self.store,
            key(self.spec, "session", self._sessions),
            {"sid": session_id, "suite": suite, "blocks": [block_to_json(b) for b in plan.blocks]},
        )
        return SessionPeers(self, session_id, self.config.out / "ranks")

    def mark_lost(self, node: int, why: str) -> str:
        self.gone.add(node)
        if self.liveness is not None:
            self.liveness.forget(node)
        self.lost = self.lost or why
        return why

    def close(self, error: str = "") -> None:
        """Tell the followers that the run is over (with the error that ended it, if any)."""
        if self._store is None:
            return
        put(self._store, key(self.spec, "session", self._sessions + 1), {"done": True, "error": error})
        deadline = time.monotonic() + BYE_S
        waiting = [n for n in sorted(self.joined) if n not in self.gone]
        while waiting and time.monotonic() < deadline:
            waiting = [n for n in waiting if fetch(self._store, key(self.spec, "bye", n)) is None]
            time.sleep(POLL_S)
        if self._heartbeat is not None:
            self._heartbeat.stop()
        self._store = None  # the store's server stops with its last reference


class SessionPeers:
    """The followers' part of one session, as session.py sees it (its `peers`)."""

    def __init__(self, writer: Writer, session_id: str, ranks: Path) -> None:
        self.writer = writer
        self.sid = session_id
        self.ranks = ranks
        self._read = {n: 0 for n in writer.followers}
        self._ended: dict[int, dict] = {}
        self._stop_sent = False

    def check(self) -> str:
        """Relay what the followers sent; a crash signature when one's part of the world died
        or a node stopped responding (then session.py ends the session), else ""."""
        w = self.writer
        self._relay()
        stop = self.ranks / f"{self.sid}.stop"
        if not self._stop_sent and stop.exists():
            # The runner asked for a graceful stop: every node's ranks read their own stop file.
            put(w.store, key(w.spec, "stop", self.sid), stop.read_text())
            self._stop_sent = True
        for node, end in sorted(self._ended.items()):
            if end.get("returncode"):
                return f"crash on node {node}: {end.get('signature', '').removeprefix('crash: ')}"
        for node, quiet in w.live.lost():
            return "crash: " + w.mark_lost(node, f"node {node} stopped responding (no heartbeat for {quiet:.0f} s)")
        return ""

    def finish(self) -> None:
        """The local part ended: end the followers' parts and take in their last events."""
        w = self.writer
        put(w.store, key(w.spec, "over", self.sid), 1)
        deadline = time.monotonic() + w.spec.lost_after + 5.0
        while True:
            self._relay()
            for node, quiet in w.live.lost():
                w.mark_lost(node, f"node {node} stopped responding (no heartbeat for {quiet:.0f} s)")
            pending = [n for n in w.followers if n not in self._ended and n not in w.gone]
            if not pending:
                return
            if time.monotonic() > deadline:
                for node in pending:
                    w.mark_lost(node, f"node {node} did not end session {self.sid}")
                return
            time.sleep(POLL_S)

    def _relay(self) -> None:
        """Append every follower's new events to OUT/ranks/ under the ranks' own file names."""
        w = self.writer
        for node in w.followers:
            if node in w.gone or node in self._ended:
                continue
            # `ended` is set after the follower's last batch: read it first, then every batch.
            ended = fetch(w.store, key(w.spec, "ended", self.sid, node))
            count = w.store.add(key(w.spec, "events", self.sid, node, "n"), 0)
            while self._read[node] < count:
                batch = json.loads(w.store.get(key(w.spec, "events", self.sid, node, self._read[node])))
                for name, events in batch.items():
                    if Path(name).name != name or not name.startswith(f"{self.sid}-rank-"):
                        continue  # only the session's rank logs, never a path elsewhere
                    with open(self.ranks / name, "a", encoding="utf-8") as fh:
                        fh.writelines(json.dumps(e) + "\n" for e in events)
                self._read[node] += 1
            if ended is not None:
                self._ended[node] = ended


def difference(mine: dict, theirs: dict) -> str:
    """The first setting in which two nodes' runs differ, as one phrase; "" when they agree."""
    for name in sorted(set(mine) | set(theirs)):
        if mine.get(name) != theirs.get(name):
            return f"its {name} is {theirs.get(name)!r}, node 0's {mine.get(name)!r}"
    return ""
