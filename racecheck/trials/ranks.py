"""Merging the per-rank outcome streams of one pytest session into one outcome per test.

Each rank's plugin appends `start` and `outcome` events to its own JSONL file. A test's merged
outcome is the worst over ranks; it is emitted once every rank has reported it. When a session
ends early, tests that some ranks started but not all finished become `crash` (or `timeout`);
session.py decides which.
"""

from __future__ import annotations

import json
from pathlib import Path

from racecheck.trials.record import Outcome, worst


class RankTail:
    """Reads the complete lines appended to one rank's file since the last call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = ""

    def read(self) -> list[dict]:
        try:
            with open(self.path, encoding="utf-8") as fh:
                fh.seek(self._offset)
                chunk = fh.read()
                self._offset = fh.tell()
        except FileNotFoundError:
            return []
        text = self._partial + chunk
        lines = text.split("\n")
        self._partial = lines.pop()  # an unterminated last line is kept for the next read
        events = []
        for line in lines:
            if line.strip():
                try:
                    events.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
        return events


Key = tuple[int, str, str]  # (trial, arm, test)


class RankMerger:
    """Collects events from `world_size` ranks and yields merged outcomes as they complete.

    Events carry `rank` and, under pytest-xdist, `worker`: an xdist worker is not a rank (each
    test is reported by one worker of each rank), so a test is complete once every rank reported it.
    """

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self._pending: dict[Key, dict[int, dict]] = {}
        self._open: dict[Key, set] = {}  # tests started but not reported, by (rank, worker)
        self._failed: set[Key] = set()  # incomplete tests that some rank failed

    def add(self, event: dict) -> dict | None:
        """Feed one event; returns a merged outcome when this event completes a test."""
        rank = int(event.get("rank", 0))
        kind = event.get("event")
        if kind not in ("start", "outcome"):
            return None
        key = (int(event["trial"]), event["arm"], event["test"])
        process = (rank, event.get("worker", ""))
        if kind == "start":
            self._open.setdefault(key, set()).add(process)
            return None
        opened = self._open.get(key)
        if opened is not None:
            opened.discard(process)
            if not opened:
                del self._open[key]
        by_rank = self._pending.setdefault(key, {})
        by_rank[rank] = event
        if len(by_rank) < self.world_size:
            if Outcome(event["outcome"]).is_failure:
                self._failed.add(key)
            return None
        del self._pending[key]
        self._failed.discard(key)
        return merge_ranks(list(by_rank.values()))

    @property
    def failed_incomplete(self) -> frozenset[Key]:
        """Tests that some rank failed while a peer has not reported them yet: such peers often
        wait in a collective that the failed rank will never enter [Note: fail-fast]."""
        return frozenset(self._failed)

    @property
    def unfinished(self) -> list[Key]:
        """Tests some rank started or reported that are not complete."""
        return sorted(set(self._pending) | set(self._open))

    def abandon(self, outcome: Outcome, *, signature: str = "", keys: list[Key] | None = None) -> list[dict]:
        """The session ended: `keys` (default: every unfinished test), which some rank started or
        reported but not every rank finished, get `outcome` (crash or timeout) unless a rank already
        reported something worse. Every other unfinished test is dropped."""
        merged = []
        for key in sorted(self.unfinished if keys is None else keys):
            reports = list(self._pending.get(key, {}).values())
            trial, arm, test = key
            filler = {"trial": trial, "arm": arm, "test": test, "outcome": outcome.value,
                      "signature": signature or f"{outcome.value}: not every rank finished the test",
                      "message": f"the session ended ({outcome.value}) before every rank reported"}
            merged.append(merge_ranks(reports + [filler]))
        self._pending.clear()
        self._open.clear()
        self._failed.clear()
        return merged

    def abandon_after_peer_failure(self, keys: list[Key]) -> list[dict]:
        """The session was ended because a rank failed while its peers waited [Note: fail-fast]:
        each of `keys` gets the failing rank's own outcome, signature and message (prefixed with
        its rank); the ranks that never reported add nothing worse. Other unfinished tests drop."""
        merged = []
        for key in sorted(keys):
            reports = list(self._pending.get(key, {}).values())
            failing = [r for r in reports if Outcome(r["outcome"]).is_failure]
            if not failing:  # a test the failing rank never reached: its peers were stopped in it
                trial, arm, test = key
                failing = [{"trial": trial, "arm": arm, "test": test, "outcome": Outcome.ERROR.value,
                            "signature": "error: a peer rank failed and the session was stopped",
                            "message": "stopped while waiting for a rank that had failed"}]
            bad = worst(r["outcome"] for r in failing)
            first = next(r for r in failing if r["outcome"] == bad.value)
            one = merge_ranks(reports + failing)
            one.update(outcome=bad.value, signature=first.get("signature", ""),
                       message=f"rank {first.get('rank', 0)}: {first.get('message', '')} "
                               f"(its peers were stopped: they waited for it)")
            merged.append(one)
        self._pending.clear()
        self._open.clear()
        self._failed.clear()
        return merged


def merge_ranks(reports: list[dict]) -> dict:
    """One outcome from every rank's report of the same test: the worst outcome wins, and its
    signature and message come from the first rank that had it."""
    verdict = worst(r["outcome"] for r in reports)
    first_bad = next((r for r in reports if r["outcome"] == verdict.value), reports[0])
    base = next((r for r in reports if "params" in r), reports[0])
    detector = [text for r in reports for text in r.get("reports", [])]
    return {
        "trial": base["trial"], "arm": base["arm"], "test": base["test"],
        "params": base.get("params", ""), "seed": base.get("seed", 0),
        "outcome": verdict.value, "signature": first_bad.get("signature", ""),
        "message": first_bad.get("message", ""),
        "device": base.get("device", "cpu"),
        "duration": max(float(r.get("duration", 0.0)) for r in reports),
        "detected": max(int(r.get("detected", 0)) for r in reports),
        "reports": list(dict.fromkeys(detector)),
        **_patch_fields(reports),
    }


def _patch_fields(reports: list[dict]) -> dict:
    """Patch mode's fields (project suites): actions summed over ranks, delayed points joined."""
    counted = [r["actions"] for r in reports if isinstance(r.get("actions"), dict)]
    if not counted:
        return {}
    actions: dict = {}
    for a in counted:
        for kind, n in a.items():
            actions[kind] = actions.get(kind, 0) + int(n)
    out = {"actions": actions, "perturb": next((r["perturb"] for r in reports if r.get("perturb")), ""),
           "delayed": list(dict.fromkeys(k for r in reports for k in r.get("delayed", [])))}
    handoffs = [int(r["handoffs"]) for r in reports if r.get("handoffs") is not None]
    if handoffs:
        out["handoffs"] = max(handoffs)
    return out
