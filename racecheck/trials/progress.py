"""The runner's terminal feedback: a progress bar with live per-arm tallies, and one replay line
per failing trial."""

from __future__ import annotations

import sys
from collections import defaultdict

from tqdm import tqdm

from racecheck.trials.record import Outcome, TrialRecord


class Progress:
    def __init__(self, config, *, enabled: bool = True) -> None:
        self.config = config
        self.enabled = enabled
        self._bar: tqdm | None = None
        self._failed_trials: dict[str, set] = defaultdict(set)  # "scenario/arm" -> failing trials
        self._seen_trials: dict[str, set] = defaultdict(set)
        self._expected = 0

    def __enter__(self) -> "Progress":
        if self.enabled:
            self._bar = tqdm(total=None, unit="test", dynamic_ncols=True, file=sys.stderr,
                             desc="trials", leave=True)
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.close()

    def expect(self, count: int) -> None:
        """A session collected `count` test runs: grow the bar's total."""
        self._expected += count
        if self._bar is not None:
            self._bar.total = self._expected
            self._bar.refresh()

    def record(self, record: TrialRecord) -> None:
        key = f"{record.scenario}/{record.arm}" if len(self.config.scenarios) > 1 else record.arm
        self._seen_trials[key].add(record.trial)
        if Outcome(record.outcome).is_failure and record.trial not in self._failed_trials[key]:
            self._failed_trials[key].add(record.trial)
            self._write(f"{record.outcome}: {key} trial {record.trial} {record.test.split('::')[-1]}"
                        f" ({record.signature}); replay: {record.replay}")
        if self._bar is not None:
            self._bar.update(1)
            self._bar.set_postfix_str("  ".join(
                f"{k} {len(self._failed_trials[k])}/{len(v)} failed" for k, v in self._seen_trials.items()))

    def _write(self, line: str) -> None:
        if self._bar is not None:
            self._bar.write(line, file=sys.stderr)
        else:
            print(line, file=sys.stderr)
