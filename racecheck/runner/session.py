"""Running one pytest session for the trial runner: launch it, follow its ranks' outcome streams,
and end it - normally, by the runner's request at a trial boundary, or by force when it hangs.

How a session ends decides what is recorded for the tests in flight (the `Ending`):
- FINISHED: pytest exited 0 and every rank logged the end of its session, or every block is
  complete and every rank has logged its end, and the teardown left (which records nothing) is
  cut short after EXIT_GRACE_S; a test some process started and never reported (an xdist worker
  that died) becomes `crash`.
- CRASHED: pytest (or a rank) exited otherwise, or exited 0 without logging the end of its
  session (a test that called `os._exit(0)`): the test in flight becomes `crash`, with the exit
  code or signal in its signature.
- TIMED_OUT: no test started or finished for `timeout` seconds: the whole process tree is killed
  and the test in flight becomes `timeout`.
- RANK_FAILED: a rank failed a test that its peers did not finish within FAILFAST_S: the process
  tree is killed and that test takes the failing rank's outcome ([Note: fail-fast]).
- STOPPED: the runner asked for a stop (--max-time, early-stop rules, see [Note: graceful stop]);
  nothing is invented for tests in flight: incomplete blocks are simply not completed.
A block that a session did not complete runs on in the next one (unless the run stops): pytest
may also stop early with exit code 0 (`-x`, a plugin calling `pytest.exit`), and a test it did
not report is never taken as run. Only the test in flight is blamed: of the earliest incomplete
block, the unfinished test that was started first (a rank that died in test B leaves its healthy
peers in test C, which they entered; C is run again, not recorded as a crash). Tests after it, in
its block and in later blocks that some fast rank had entered, are left to the next session,
which resumes the block after the tests it has recorded ([Note: resumed blocks] in blocks.py).
A session that recorded no outcome at all could not start: that is an infrastructure error, not a
trial.

[Note: graceful stop] The runner writes a trial index T to the stop file; every process checks it
at each trial boundary and stops before entering trial T (rank/plugin.py). T is one past the latest
trial any rank has started, so ranks kept in step by their collectives stop at the same boundary.
Should a rank have passed the boundary unseen, it waits in a collective for peers that have left;
once another process has finished after the stop, such stragglers are killed after a short grace.

[Note: fail-fast] Under the runner every rank exits 0 after failing tests (rank/plugin.py), so torchrun
does not tear a world down when one rank fails. A rank whose setup raised before it joined a
collective (or that failed before one) leaves its peers waiting there until the process group's
own timeout, which user code sets, often to 30 minutes. The runner watches the world instead: once
a rank has failed a test that some peer has not reported for FAILFAST_S, the world is taken to be
broken, the session is killed, the test gets the failing rank's error (with its rank), and the
rest of the plan runs in a fresh session. A peer that merely takes longer than FAILFAST_S to
finish a test that another rank failed loses only its own part of that test's report.
"""

from __future__ import annotations

import dataclasses
import enum
import errno
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from racecheck.exitcodes import InfrastructureError, InputError, SuiteRejected
from racecheck.protocol.rank_events import Collected, CollectError, Finished, RankEvent, Started, TestOutcome
from racecheck.protocol.records import Outcome, worst
from racecheck.protocol.schedule import Block
from racecheck.runner import interrupts, launch
from racecheck.runner.blocks import SessionPlan
from racecheck.runner.held_folder import FolderFault
from racecheck.runner.ranks import RankMerger, RankTail

POLL_S = 0.05
STRAGGLER_GRACE_S = 5.0
STARTUP_S = 120.0  # patience until the session has collected (interpreter, imports, rendezvous)
EXIT_GRACE_S = 1.0  # teardown allowed once every outcome is in, before the session is ended
FAILFAST_S = 5.0  # how long peers may leave a test unreported that one rank failed [Note: fail-fast]


class Ending(enum.Enum):
    FINISHED = "finished"
    CRASHED = "crashed"
    TIMED_OUT = "timed out"
    RANK_FAILED = "a rank failed"
    STOPPED = "stopped"


@dataclasses.dataclass
class SessionResult:
    ending: Ending
    completed: list[Block]  # blocks whose every test has an outcome (or that crashed / timed out)
    remaining: list[Block]  # blocks of the plan still to run, in order


class SessionRun:
    """One pytest session of a plan. `on_merged(TestOutcome)` gets every merged test outcome as it is
    known, `on_block(block, outcome)` every block as it completes, `should_stop()` is polled."""

    def __init__(
        self,
        spec: launch.SessionSpec,
        plan: SessionPlan,
        *,
        files: Path,
        timeout: float,
        on_merged: Callable[[TestOutcome], None],
        on_block: Callable[[Block, Outcome], None],
        should_stop: Callable[[], bool] = lambda: False,
        on_start: Callable[[int], None] = lambda pid: None,
        peers=None,
    ) -> None:
        self.spec = spec
        self.plan = plan
        self.files = files  # the per-process logs: FILES-rank-R[-WORKER].jsonl
        self.timeout = timeout
        self.on_merged = on_merged
        self.on_block = on_block
        self.should_stop = should_stop
        self.on_start = on_start
        # The other nodes' part of a world across nodes (node_writer.SessionPeers), else None:
        # it relays their ranks' events into `files`' folder and reports a node that died.
        self.peers = peers
        self._peer_failure = ""
        self.stop_file = files.with_name(files.name + ".stop")
        self._index = {b: i for i, b in enumerate(plan.blocks)}
        self._merger = RankMerger(spec.world_size)
        self._tails: dict[Path, RankTail] = {}
        self._collected = 0
        self._saw_collected = False
        self._collect_errors: list[CollectError] = []
        self._outcomes: dict[Block, list[str]] = {}
        self._tests: dict[Block, list[str]] = {}  # the tests with an outcome, per block
        self._done: list[Block] = []
        self._started_trial = -1
        self._stop_sent = False
        self._finished_after_stop = False
        self._finished: set = set()  # (rank, worker) of every process that logged its session's end
        self._all_reported_at: float | None = None
        self._last_progress = time.monotonic()
        self._peer_failed_since: dict = {}  # test -> when a rank's failure of it was first seen

    # -- events -----------------------------------------------------------------------------------
    def _poll_files(self) -> None:
        # The files already followed too: a test that removed the run folder removed their names.
        for path in sorted(set(self.files.parent.glob(f"{self.files.name}-rank-*.jsonl")) | set(self._tails)):
            tail = self._tails.setdefault(path, RankTail(path))
            for event in tail.read():
                self._event(event)

    def _event(self, event: RankEvent) -> None:
        match event:
            case Collected(count=count):
                self._saw_collected = True
                self._last_progress = time.monotonic()  # --timeout counts from here, not from the start
                if count > self._collected:  # every rank (and xdist worker) collects the whole suite
                    self._collected = count
            case CollectError():
                self._collect_errors.append(event)
            case Finished(rank=rank, worker=worker, stopped=stopped):
                self._finished.add((rank, worker))
                if stopped:
                    self._finished_after_stop = True
            case Started() | TestOutcome():
                self._last_progress = time.monotonic()
                if isinstance(event, Started):
                    self._started_trial = max(self._started_trial, event.trial)
                merged = self._merger.add(event)
                if merged is not None:
                    self._merged(merged)

    def _merged(self, merged: TestOutcome) -> None:
        self.on_merged(merged)
        block = Block(merged.trial, merged.arm)
        outcomes = self._outcomes.setdefault(block, [])
        outcomes.append(merged.outcome)
        self._tests.setdefault(block, []).append(merged.test)
        if block in self._index and block not in self._done and self._collected:
            if len(outcomes) >= self._expected(block):
                self._complete(block)

    def _expected(self, block: Block) -> int:
        """The outcomes that complete `block` in this session: the tests of one block (every step
        collects the same), less those an earlier session recorded (deselected in this one)."""
        planned = self.plan.blocks
        every = (self._collected + sum(len(b.done) for b in planned)) // max(len(planned), 1)
        return every - len(planned[self._index[block]].done)

    def _complete(self, block: Block) -> None:
        self._done.append(block)
        self.on_block(block, worst(self._outcomes.get(block, [])))

    # -- the session ------------------------------------------------------------------------------
    def run(self) -> SessionResult:
        try:
            proc = launch.start(self.spec)
        except OSError as exc:
            if exc.errno == errno.E2BIG:  # the arm's env or pytest arguments: the user's to shorten
                raise InputError(
                    f"cannot start pytest: its arguments and environment are more than a process takes "
                    f"({exc.strerror}); shorten the arm's env values or pytest_args"
                ) from None
            raise InfrastructureError(f"could not start pytest: {exc}") from None
        ending = None
        try:
            self.on_start(proc.pid)
            while ending is None:
                exited = proc.poll() is not None
                failure = self.peers.check() if self.peers is not None else ""
                self._poll_files()
                if exited:
                    ending = Ending.FINISHED if proc.returncode == 0 and self._every_rank_ended() else Ending.CRASHED
                elif failure:  # another node's ranks died: this node's cannot finish the world's tests
                    launch.kill_tree(proc)
                    self._poll_files()
                    self._peer_failure = failure
                    ending = Ending.CRASHED
                elif time.monotonic() - self._last_progress > self._patience():
                    launch.kill_tree(proc)
                    self._poll_files()
                    ending = Ending.STOPPED if self._finished_after_stop else Ending.TIMED_OUT
                elif self._only_teardown_left():
                    launch.kill_tree(proc, grace=1.0)
                    ending = Ending.FINISHED
                elif self._world_broken():
                    launch.kill_tree(proc)
                    self._poll_files()
                    ending = Ending.RANK_FAILED if self._merger.failed_incomplete else Ending.CRASHED
                else:
                    if not self._stop_sent and self.should_stop():
                        self._request_stop()
                    time.sleep(POLL_S)
                    interrupts.check()
        finally:
            self._end(proc)
        if self._stop_sent and ending is not Ending.TIMED_OUT:
            ending = Ending.STOPPED
        self._check_suite(ending, proc.returncode)
        self._close(ending, proc.returncode)
        finished = set(self._done)
        remaining = [
            dataclasses.replace(b, done=b.done + tuple(self._tests.get(b, ())))
            for b in self.plan.blocks
            if b not in finished
        ]
        if ending is not Ending.STOPPED and remaining and not any(b in self._index for b in self._outcomes):
            raise InfrastructureError(
                f"the pytest session ended ({ending.value}, exit code {proc.returncode}) "
                f"without finishing a trial; see {self.spec.log_path}: "
                f"{last_lines(self.spec.log_path)}"
            )
        return SessionResult(ending, list(self._done), remaining)

    def _end(self, proc: subprocess.Popen) -> None:
        """However the session ended: nothing of it left running, its log and last events in."""
        if proc.poll() is None:  # interrupted (Ctrl-C) or an error in the loop: leave nothing behind
            launch.kill_tree(proc)
        launch.finish(proc)  # nor a daemon that a test started and left running
        if self.peers is not None:  # end the other nodes' parts too; their last events land here
            self.peers.finish()
            self._poll_files()
        for tail in self._tails.values():
            tail.close()

    def _only_teardown_left(self) -> bool:
        """Every block of the plan is complete and every rank has logged the end of its session:
        what is left is interpreter and launcher teardown (seconds for a multi-rank world),
        which can change no outcome. After EXIT_GRACE_S of it the session is ended."""
        if len(self._done) < len(self.plan.blocks) or not self._finished:
            return False
        if len({rank for rank, _ in self._finished}) < self.spec.world_size:
            return False
        now = time.monotonic()
        if self._all_reported_at is None:
            self._all_reported_at = now
        return now - self._all_reported_at > EXIT_GRACE_S

    def _every_rank_ended(self) -> bool:
        """Whether every rank's pytest logged the end of its session: a process that exits 0
        without it (`os._exit(0)` in a test) vanished mid-session, as a crash does."""
        return len({rank for rank, _ in self._finished}) >= self.spec.world_size

    def _world_broken(self) -> bool:
        """Whether a rank's failure has left its peers waiting for FAILFAST_S [Note: fail-fast]."""
        now = time.monotonic()
        failed = self._merger.failed_incomplete
        self._peer_failed_since = {k: self._peer_failed_since.get(k, now) for k in failed}
        return any(now - since > FAILFAST_S for since in self._peer_failed_since.values())

    def _patience(self) -> float:
        """Seconds without progress before the session is killed: --timeout, or a short grace
        for stragglers once a process has finished after a requested stop."""
        if self._finished_after_stop:
            return min(self.timeout, STRAGGLER_GRACE_S)
        return self.timeout if self._saw_collected else max(self.timeout, STARTUP_S)

    def _request_stop(self) -> None:
        self._stop_sent = True
        try:
            self.stop_file.parent.mkdir(parents=True, exist_ok=True)  # a test may have removed it
            self.stop_file.write_text(f"{self._started_trial + 1}\n")
        except OSError as exc:  # the files are OUT/ranks/SID-...
            raise FolderFault.refused(self.files.parent.parent, self.stop_file, exc) from None

    def _close(self, ending: Ending, returncode: int | None) -> None:
        """Record what the ending means for the tests in flight (see the module docstring)."""
        unfinished = self._merger.unfinished
        if ending is Ending.STOPPED or not unfinished:
            self._merger.abandon(Outcome.CRASH, keys=[])
            return
        first = min(self._index.get(Block(t, a), len(self._index)) for t, a, _ in unfinished)
        blamed = [k for k in unfinished if self._index.get(Block(k[0], k[1])) == first]
        if ending is not Ending.FINISHED:  # the test in flight (a dead xdist worker: each of its)
            blamed = [min(blamed, key=self._merger.first_seen)]
        if ending is Ending.RANK_FAILED:
            abandoned = self._merger.abandon_after_peer_failure(blamed)
        elif ending is Ending.TIMED_OUT:
            abandoned = self._merger.abandon(
                Outcome.TIMEOUT,
                keys=blamed,
                signature=f"timeout: no test finished within {self.timeout:g} s; the session was killed",
            )
        else:
            abandoned = self._merger.abandon(
                Outcome.CRASH,
                keys=blamed,
                signature=self._peer_failure or crash_signature(returncode, self.spec.log_path),
            )
        for merged in abandoned:
            self._merged(merged)

    def _check_suite(self, ending: Ending, returncode: int | None) -> None:
        """Bad input, reported in one line: collection errors, pytest usage errors, no tests; named
        by its arm where the session runs one (an arm's own revision, env or pytest_args may be
        what pytest could not take, after other arms' trials ran)."""
        try:
            self._check_collected(ending, returncode)
        except InputError as exc:
            arms = self.plan.arms
            where = f"arm {arms[0]!r}: " if len(arms) == 1 and arms[0] else ""
            raise SuiteRejected(f"{where}{exc}") from None

    def _check_collected(self, ending: Ending, returncode: int | None) -> None:
        if self._collect_errors:
            e = self._collect_errors[0]
            others = {x.nodeid for x in self._collect_errors} - {e.nodeid}  # each rank and worker logs its own
            more = f" (and {len(others)} more)" if others else ""
            raise InputError(
                f"pytest could not collect {e.nodeid or 'the suite'}: {e.message}{more}; see {self.spec.log_path}"
            )
        if self._outcomes or self._merger.unfinished or ending is Ending.STOPPED:
            return
        text = _read(self.spec.log_path)
        errors = re.findall(r"^(?:.*: error: |ERROR: )(?!usage:)(.*)$", text, re.M)
        if errors:
            raise InputError(f"pytest rejected its arguments: {errors[0].strip()}")
        conftest = re.search(r"^ImportError while loading conftest '(.*?)'", text, re.M)
        if conftest or returncode == 4:
            marked = re.findall(r"^E\s+(.*)$", text, re.M)
            detail = marked[-1] if marked else last_lines(self.spec.log_path)
            what = f"load {conftest.group(1)}" if conftest else "start the suite"
            raise InputError(f"pytest could not {what}: {detail.strip()}")
        if self._saw_collected and self._collected == 0 or returncode == 5:
            raise InputError(
                f"pytest collected no tests (pytest {' '.join(self.spec.user_args) or 'with no arguments'}); "
                f"see {self.spec.log_path}"
            )


def crash_signature(returncode: int | None, log_path: Path) -> str:
    """`crash: killed by SIGKILL` or `crash: the process died without a report (exit code N)`;
    where torchrun's report names ranks, `crash: rank R ...`: its root cause (the first failure it
    observed), unless that rank ended by the SIGTERM torchrun sends the survivors of a failure
    (which, under load, it may observe first): then the first rank it lists that did not."""
    code, who = returncode, ""
    text = _read(log_path)
    failures, heading, root = text.rpartition("Root Cause")
    if not heading:  # no torchrun report of that shape: every rank listed is a failure
        failures, root = text, ""
    entry = r"rank\s*:\s*(\d+)[^\n]*\n\s*exitcode\s*:\s*(-?\d+)"
    ranks = [(r, int(c)) for r, c in re.findall(entry, root)[:1] + re.findall(entry, failures)]
    if ranks:
        rank, code = next((rc for rc in ranks if rc[1] != -signal.SIGTERM), ranks[0])
        who = f"rank {rank} "
    elif codes := re.findall(r"exitcode\s*:\s*(-?\d+)", text):
        code = int(codes[0])
    if code is not None and code < 0:
        try:
            return f"crash: {who}killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"crash: {who}killed by signal {-code}"
    return f"crash: {who or 'the process '}died without a report (exit code {code})"


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def last_lines(path: Path, n: int = 3) -> str:
    lines = [ln for ln in _read(path).splitlines() if ln.strip()]
    return " | ".join(lines[-n:])[-400:]
