"""Merging the per-rank outcome streams of one pytest session into one outcome per test.

Each rank's plugin appends rank events (protocol/rank_events.RankEvent: `Started`,
`TestOutcome`, ...) to its own JSONL file. A test's merged outcome is the worst over ranks; it is
emitted once every rank has reported it. When a session ends early, tests that some ranks started
but not all finished become `crash` (or `timeout`); session.py decides which.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import BinaryIO

from racecheck.protocol.durable import names
from racecheck.protocol.rank_events import RankEvent, Started, TestOutcome
from racecheck.protocol.records import Outcome, worst


class RankTail:
    """Reads the complete events appended to one rank's file since the last call (a line that is
    not a rank event, such as one torn by a kill, is skipped). The file is held open from the
    first read that finds it until close(), and its name is followed: a test that removes the run
    folder removes the name, and the rank writes the whole file again under it at its next event
    (rank/rank_log.RankLog), where the tail reads on from the same offset."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fh: BinaryIO | None = None
        self._offset = 0  # bytes of the rank's file read so far
        self._partial = b""

    def read(self) -> list[RankEvent]:
        lines = (self._partial + self._appended()).split(b"\n")
        self._partial = lines.pop()  # an unterminated last line is kept for the next read
        events = []
        for line in lines:
            if line.strip():
                try:
                    events.append(RankEvent.from_dict(json.loads(line)))
                except ValueError:  # json.JSONDecodeError and UnicodeDecodeError included
                    continue
        return events

    def _appended(self) -> bytes:
        data = b""
        if self._fh is not None:
            data = self._fh.read()
            self._offset += len(data)
            if names(self.path, self._fh.fileno()):
                return data
        try:  # first found, or written again under its name after a removal
            fh = open(self.path, "rb")
        except FileNotFoundError:
            return data
        if self._fh is not None:
            self._fh.close()
        fh.seek(self._offset)
        self._fh = fh
        more = fh.read()
        self._offset += len(more)
        return data + more

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


Key = tuple[int, str, str]  # (trial, arm, test)


class RankMerger:
    """Collects events from `world_size` ranks and yields merged outcomes as they complete.

    Events carry `rank` and, under pytest-xdist, `worker`: an xdist worker is not a rank (each
    test is reported by one worker of each rank), so a test is complete once every rank reported it.
    """

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self._pending: dict[Key, dict[int, TestOutcome]] = {}
        self._open: dict[Key, set] = {}  # tests started but not reported, by (rank, worker)
        self._failed: set[Key] = set()  # incomplete tests that some rank failed
        self._seen: dict[Key, int] = {}  # the order in which tests were first started or reported

    def add(self, event: RankEvent) -> TestOutcome | None:
        """Feed one event; returns a merged outcome when this event completes a test."""
        if not isinstance(event, (Started, TestOutcome)):
            return None
        rank = event.rank
        key = (event.trial, event.arm, event.test)
        self._seen.setdefault(key, len(self._seen))
        process = (rank, event.worker)
        if isinstance(event, Started):
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
            if Outcome(event.outcome).is_failure:
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

    def first_seen(self, key: Key) -> int:
        """Where `key` came in the order in which some rank first started or reported a test."""
        return self._seen.get(key, len(self._seen))

    @property
    def unfinished(self) -> list[Key]:
        """Tests some rank started or reported that are not complete."""
        return sorted(set(self._pending) | set(self._open))

    def abandon(self, outcome: Outcome, *, signature: str = "", keys: list[Key] | None = None) -> list[TestOutcome]:
        """The session ended: `keys` (default: every unfinished test), which some rank started or
        reported but not every rank finished, get `outcome` (crash or timeout) unless a rank already
        reported something worse. Every other unfinished test is dropped."""
        merged = []
        for key in sorted(self.unfinished if keys is None else keys):
            reported = self._pending.get(key, {})
            reports = list(reported.values())
            trial, arm, test = key
            filler = TestOutcome(
                trial=trial,
                arm=arm,
                test=test,
                outcome=outcome.value,
                signature=signature or f"{outcome.value}: not every rank finished the test",
                message=f"the session ended ({outcome.value}) {self._unreported(reported)}",
            )
            merged.append(merge_ranks(reports + [filler]))
        self._pending.clear()
        self._open.clear()
        self._failed.clear()
        return merged

    def _unreported(self, reported: dict) -> str:
        """Which ranks a test abandoned with the session still waited for: the ones to look at."""
        if self.world_size == 1:
            return "while the test ran"
        missing = [str(r) for r in range(self.world_size) if r not in reported]
        return f"before {'rank' if len(missing) == 1 else 'ranks'} {', '.join(missing)} reported"

    def abandon_after_peer_failure(self, keys: list[Key]) -> list[TestOutcome]:
        """The session was ended because a rank failed while its peers waited [Note: fail-fast]:
        each of `keys` gets the failing rank's own outcome, signature and message (prefixed with
        its rank); the ranks that never reported add nothing worse. Other unfinished tests drop."""
        merged = []
        for key in sorted(keys):
            reports = list(self._pending.get(key, {}).values())
            failing = [r for r in reports if Outcome(r.outcome).is_failure]
            if not failing:  # a test the failing rank never reached: its peers were stopped in it
                trial, arm, test = key
                failing = [
                    TestOutcome(
                        trial=trial,
                        arm=arm,
                        test=test,
                        outcome=Outcome.ERROR.value,
                        signature="error: a peer rank failed and the session was stopped",
                        message="stopped while waiting for a rank that had failed",
                    )
                ]
            bad = worst(r.outcome for r in failing)
            first = next(r for r in failing if r.outcome == bad.value)
            one = merge_ranks(reports + failing)
            merged.append(
                dataclasses.replace(
                    one,
                    outcome=bad.value,
                    signature=first.signature,
                    message=f"rank {first.rank}: {first.message} (its peers were stopped: they waited for it)",
                )
            )
        self._pending.clear()
        self._open.clear()
        self._failed.clear()
        return merged


def merge_ranks(reports: list[TestOutcome]) -> TestOutcome:
    """One outcome from every rank's report of the same test: the worst outcome wins, and its
    signature and message come from the first rank that had it. Ranks' own reports come first,
    fillers the runner made (abandon) after them, so the first report's fields are a rank's."""
    verdict = worst(r.outcome for r in reports)
    first_bad = next((r for r in reports if r.outcome == verdict.value), reports[0])
    base = reports[0]
    detector = [text for r in reports for text in r.reports]
    return TestOutcome(
        trial=base.trial,
        arm=base.arm,
        test=base.test,
        params=base.params,
        seed=base.seed,
        outcome=verdict.value,
        signature=first_bad.signature,
        message=first_bad.message,
        racecheck_frame=next((r.racecheck_frame for r in reports if r.racecheck_frame), None),
        device=base.device,
        duration=max(float(r.duration) for r in reports),
        detected=max(int(r.detected) for r in reports),
        reports=list(dict.fromkeys(detector)),
        **_patch_fields(reports),
        **_detector_fields(reports),
    )


def _patch_fields(reports: list[TestOutcome]) -> dict:
    """Patch mode's fields (project suites): actions summed over ranks, delayed points joined."""
    counted = [r.actions for r in reports if isinstance(r.actions, dict)]
    if not counted:
        return {}
    actions: dict = {}
    for a in counted:
        for kind, n in a.items():
            actions[kind] = actions.get(kind, 0) + int(n)
    out: dict[str, object] = {
        "actions": actions,
        "perturb": next((r.perturb for r in reports if r.perturb), ""),
        "delayed": list(dict.fromkeys(k for r in reports for k in (r.delayed or []))),
    }
    handoffs = [int(r.handoffs) for r in reports if r.handoffs is not None]
    if handoffs:
        out["handoffs"] = max(handoffs)
    return out


def _detector_fields(reports: list[TestOutcome]) -> dict:
    """The detector's fields (project suites): launches of kernels it could not read, summed over
    ranks, and the tracker's own errors, each message once."""
    unseen: dict[str, int] = {}
    for r in reports:
        for name, n in (r.unseen_kernels or {}).items():
            unseen[name] = unseen.get(name, 0) + int(n)
    errors = list(dict.fromkeys(e for r in reports for e in (r.detector_errors or [])))
    return {**({"unseen_kernels": unseen} if unseen else {}), **({"detector_errors": errors} if errors else {})}
