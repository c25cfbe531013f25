"""The run folder as the runner holds it while it runs (state.py says what each file is for): the
logs it appends to (trials.jsonl, completed.jsonl) and the files it rewrites (run.json,
runner.json), kept against two faults that a run cannot prevent:

- a write the file system refuses (a full disk, a quota, a file-size limit, a folder turned
  read-only): FolderFault, an infrastructure error (one line, exit 3) that names the file and says
  how to continue. Every record written before it is in the log and none is torn (protocol/durable.py), so
  `racecheck run --resume OUT` goes on from there once the folder takes writes again.
- the folder, or a file of it, removed or replaced under the run (a test's cleanup that deletes
  `racecheck-out`): the runner holds its logs open and run.json and runner.json in memory, so
  before each write `check()` writes the folder again from them, says so, and the run goes on.
  What only the folder held (the logs of sessions before) is lost with it; the session that runs
  on reads its ranks' events from the files it holds open (ranks.RankTail).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

from racecheck.exitcodes import InfrastructureError
from racecheck.protocol.records import TrialRecord
from racecheck.protocol.schedule import Block
from racecheck.runner import state
from racecheck.runner.command_lines import resume_command
from racecheck.runner.trial_log import TrialLog

TRIALS_FILE = "trials.jsonl"
_ROUNDS = 5  # how often check() writes the folder again while a removal still goes on


class FolderFault(InfrastructureError):
    """The run folder refused a write, or was removed and cannot be written again: the run stops."""

    @classmethod
    def refused(cls, out: Path, path: Path, exc: OSError) -> FolderFault:
        """The fault of a write to `path`, in run folder `out`, that the file system refused."""
        return cls(
            f"cannot write {path}: {exc.strerror or exc}; the run stopped and keeps every trial it "
            f"finished; once the folder takes writes, continue with: {resume_command(out)}"
        )


class HeldFolder:
    """The runner's files in `out`, written only through this object while the run holds `lock`
    (taken by the runner before anything else); `note(line)` tells the user of a restore."""

    def __init__(self, out: Path, lock: state.Lock, *, note: Callable[[str], None]) -> None:
        self.out = out
        self.lock = lock
        self.note = note
        self._run: dict = {}  # run.json as last written
        self._trials: TrialLog | None = None
        self._completed: state.CompletedLog | None = None

    @contextlib.contextmanager
    def writing(self, name: str) -> Iterator[None]:
        """Within: an OSError (the file system refused to write `name`) stops the run, in one line."""
        try:
            yield
        except OSError as exc:
            raise FolderFault.refused(self.out, self.out / name, exc) from None

    def write_run(self, data: dict) -> None:
        self._run = data
        with self.writing(state.RUN_FILE):
            state.write_run(self.out, data)

    def open_logs(self) -> None:
        with self.writing(TRIALS_FILE):
            self._trials = TrialLog(self.out / TRIALS_FILE)
        with self.writing(state.COMPLETED_FILE):
            self._completed = state.CompletedLog(self.out)

    def append_record(self, record: TrialRecord) -> None:
        assert self._trials is not None, "records are appended only between open_logs() and close()"
        self.check()
        with self.writing(TRIALS_FILE):
            self._trials.append(record)

    def append_block(self, suite: str, block: Block, outcome: str, run_id: str, *, records: int) -> None:
        assert self._completed is not None, "blocks are appended only between open_logs() and close()"
        self.check()
        with self.writing(state.COMPLETED_FILE):
            self._completed.append(suite, block, outcome, run_id, records=records)

    def session(self, pid: int | None) -> None:
        """The session the runner started (None: it ended), in runner.json (state.Lock)."""
        self.check()
        with self.writing(state.LOCK_FILE):
            self.lock.session(pid)

    def check(self) -> None:
        """Write again what was removed or replaced under the run (see the module docstring); a
        removal still going on (a test's rmtree) can take it again meanwhile: then once more."""
        written: dict[str, None] = {}
        for _ in range(_ROUNDS):
            gone = self._gone()
            if not gone:
                break
            try:
                self._write_again(gone)
            except FileNotFoundError:  # removed again while it was written
                continue
            except OSError as exc:
                raise FolderFault.refused(self.out, self.out, exc) from None
            except state.FolderInUse as exc:
                raise FolderFault(str(exc)) from None
            written.update(dict.fromkeys(gone))
        else:
            if self._gone():
                raise FolderFault.refused(self.out, self.out, FileNotFoundError(0, "removed whenever written"))
        if written:
            self.note(
                f"{', '.join(written)} removed from {self.out} under the run (by the suite?): written again "
                "from what the runner holds; the run goes on (the logs of earlier sessions are lost)"
            )

    def _logs(self) -> list:
        return [log for log in (self._trials, self._completed) if log is not None]

    def _gone(self) -> list[str]:
        """The names of the files removed or replaced under the run."""
        gone = [log.path.name for log in self._logs() if log.file.gone()]
        if self._run and not (self.out / state.RUN_FILE).is_file():
            gone.append(state.RUN_FILE)
        if self.lock.gone():
            gone.append(state.LOCK_NAME)
        return gone

    def _write_again(self, gone: list[str]) -> None:
        if state.LOCK_NAME in gone:  # first, so that no other run takes the folder meanwhile
            self.lock.retake()
        for log in self._logs():
            if log.path.name in gone:
                log.file.restore()
        if state.RUN_FILE in gone:
            state.write_run(self.out, self._run)

    def close(self) -> None:
        for log in self._logs():
            log.close()
        self._trials = self._completed = None
