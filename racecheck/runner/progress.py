"""The runner's console feedback: a progress bar with live per-arm tallies on a terminal, one
status line every STATUS_EVERY trials or STATUS_S seconds elsewhere (a CI log keeps every redraw
of a bar), and, either way, one line for the first failure of each kind in each arm (its
signature, e.g. `ValueError at tests/conftest.py:15 in world`, and the first line of its message)
with its replay command; the table at the end counts them all."""

from __future__ import annotations

import sys
import time

from tqdm import tqdm

from racecheck.protocol.node_ids import short_name
from racecheck.protocol.printable import first_line
from racecheck.protocol.records import Outcome, TrialRecord
from racecheck.protocol.schedule import Block
from racecheck.runner.stopping import LiveCounts
from racecheck.runner.trial_runner import RunListener

STATUS_EVERY = 10  # trials between two status lines when the console is no terminal
STATUS_S = 30.0  # ... or seconds, whichever comes first
MESSAGE_CHARS = 200  # of a failure's message, in its line


class Progress(RunListener):
    def __init__(self, config, *, counts: LiveCounts, enabled: bool = True, stream=None) -> None:
        self.config = config
        self.counts = counts
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.terminal = bool(getattr(self.stream, "isatty", lambda: False)())
        self._bar: tqdm | None = None
        self._reported: set[tuple[str, str, str]] = set()  # (suite, arm, signature) printed
        self._multi = len(config.scenarios) > 1
        self._total = 0
        self._done = 0
        self._last_status = (0, time.monotonic())  # trials done and time at the last status line

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._bar is not None:
            if exc_type is not None:
                # The run failed (its error is printed in one line next) or was interrupted:
                # clear the bar instead of leaving it above the message.
                self._bar.leave = False
            self._bar.close()
        elif self.enabled and exc_type is None and self._done > self._last_status[0]:
            self._status()

    def planned(self, total: int, done: int) -> None:
        self._total, self._done = total, done
        if not self.enabled:
            return
        if self.terminal:  # the bar appears once its length is known
            self._bar = tqdm(
                total=total, initial=done, unit="trial", dynamic_ncols=True, file=self.stream, desc="trials", leave=True
            )
            self._tallies()
        else:
            self.note(f"trials: {total} planned" + (f", {done} already done" if done else ""))

    def record(self, record: TrialRecord) -> None:
        outcome = Outcome(record.outcome)
        key = (record.scenario, record.arm, record.signature or outcome.value)
        if outcome.is_failure and key not in self._reported:
            self._reported.add(key)
            label = f"{record.scenario}/{record.arm}" if self._multi else record.arm
            message = first_line(record.message, MESSAGE_CHARS)
            self.note(
                f"{record.outcome}: {label} trial {record.trial} {short_name(record.test)}"
                f" ({record.signature}{': ' + message if message else ''}); replay: {record.replay}"
            )
        self._tallies()

    def block(self, suite: str, block: Block, outcome: str) -> None:
        self._done += 1
        if self._bar is not None:
            self._bar.update(1)
            self._tallies()
        elif self.enabled:
            done, since = self._last_status
            if self._done - done >= STATUS_EVERY or time.monotonic() - since >= STATUS_S:
                self._status()

    def note(self, line: str) -> None:
        if self._bar is not None:
            self._bar.write(line, file=self.stream)
        else:
            print(line, file=self.stream, flush=True)

    def _arm_tallies(self) -> str:
        parts = []
        for s in self.config.scenarios:
            for arm in self.config.arms_for(s):
                label = f"{s.name}/{arm}" if self._multi else arm
                parts.append(f"{label} {self.counts.failures(s.name, arm)}/{self.counts.seen(s.name, arm)} failed")
        return "  ".join(parts)

    def _status(self) -> None:
        self._last_status = (self._done, time.monotonic())
        self.note(f"trials: {self._done}/{self._total} done; {self._arm_tallies()}")

    def _tallies(self) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(self._arm_tallies(), refresh=True)
