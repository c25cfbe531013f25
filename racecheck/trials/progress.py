"""The runner's terminal feedback: a progress bar over trials (one per arm and trial index) with
live per-arm tallies, and one replay line per failing trial."""

from __future__ import annotations

import sys

from tqdm import tqdm

from racecheck.trials.record import Outcome, TrialRecord
from racecheck.trials.runner import RunListener
from racecheck.trials.schedule import Block
from racecheck.trials.stopping import LiveCounts


class Progress(RunListener):
    def __init__(self, config, *, counts: LiveCounts, enabled: bool = True) -> None:
        self.config = config
        self.counts = counts
        self.enabled = enabled
        self._bar: tqdm | None = None
        self._reported: set[tuple[str, str, int]] = set()  # failing trials already printed
        self._multi = len(config.scenarios) > 1

    def __enter__(self) -> "Progress":
        if self.enabled:
            self._bar = tqdm(total=None, unit="trial", dynamic_ncols=True, file=sys.stderr,
                             desc="trials", leave=True)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._bar is not None:
            if exc_type is not None:
                # The run failed (its error is printed in one line next) or was interrupted:
                # clear the bar instead of leaving it above the message.
                self._bar.leave = False
            self._bar.close()

    def planned(self, total: int, done: int) -> None:
        if self._bar is not None:
            self._bar.reset(total=total)
            self._bar.update(done)
            self._tallies()

    def record(self, record: TrialRecord) -> None:
        key = (record.scenario, record.arm, record.trial)
        if Outcome(record.outcome).is_failure and key not in self._reported:
            self._reported.add(key)
            label = f"{record.scenario}/{record.arm}" if self._multi else record.arm
            self.note(f"{record.outcome}: {label} trial {record.trial} {record.test.split('::')[-1]}"
                      f" ({record.signature}); replay: {record.replay}")
        self._tallies()

    def block(self, suite: str, block: Block, outcome: str) -> None:
        if self._bar is not None:
            self._bar.update(1)
        self._tallies()

    def note(self, line: str) -> None:
        if self._bar is not None:
            self._bar.write(line, file=sys.stderr)
        else:
            print(line, file=sys.stderr)

    def _tallies(self) -> None:
        if self._bar is None:
            return
        parts = []
        for s in self.config.scenarios:
            for arm in self.config.arms_for(s):
                label = f"{s.name}/{arm}" if self._multi else arm
                parts.append(f"{label} {self.counts.failures(s.name, arm)}/"
                             f"{self.counts.seen(s.name, arm)} failed")
        self._bar.set_postfix_str("  ".join(parts), refresh=True)
