"""The trial runner: runs suites under their arms for many trials and logs every outcome.

Two isolation modes (blocks.py, [Note: sessions]):
- `session` (default, fast): one pytest session (one process world) runs many trials; the plugin
  repeats the suite (--racecheck-steps) and gives each repeat step its block (trial, arm). Trials share a
  process, so state that leaks between tests (allocator pools, warm caches, module globals) is
  shared too, and one trial can mask or cause a failure in the next. Arms that need a process of
  their own (env, pytest args, git revision) run in separate sessions of `chunk` trials each.
- `process`: a fresh process world per trial and arm: trials are independent, at the price of one
  process start-up (interpreter, imports, process-group rendezvous) per trial.

Outcomes are appended to OUT/trials.jsonl as each test finishes on every rank, and each finished
block to OUT/completed.jsonl (state.py); a session that crashes or hangs is recorded and the run
goes on with the next block in a fresh session (session.py).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import datetime
import os
import platform
import time
import uuid
from collections.abc import Iterator
from importlib import metadata

from racecheck.exitcodes import InfrastructureError, InputError
from racecheck.protocol import names
from racecheck.protocol.rank_events import TestOutcome
from racecheck.protocol.records import Outcome, TrialRecord, worst
from racecheck.protocol.schedule import Block, write_schedule
from racecheck.runner import blocks, launch, run_location, state
from racecheck.runner.blocks import SessionPlan
from racecheck.runner.command_lines import replay_command, resume_command, split_targets
from racecheck.runner.gitarms import Worktrees, pythonpath
from racecheck.runner.held_folder import FolderFault, HeldFolder
from racecheck.runner.run_config import RunConfig
from racecheck.runner.run_folder import open_run_folder
from racecheck.runner.session import Ending, SessionRun
from racecheck.runner.stopping import LiveCounts
from racecheck.runner.trial_log import repair_log
from racecheck.suites.catalogue import Suite, SuiteKind


@dataclasses.dataclass
class RunResult:
    run_id: str
    blocks: int  # blocks finished by this invocation
    stopped: str = ""  # why the run stopped early: "", "max-time", "stop rules"


class RunListener:
    """What the runner reports as it goes (progress.py draws it); every method may be left out."""

    def planned(self, total: int, done: int) -> None: ...
    def record(self, record: TrialRecord) -> None: ...
    def block(self, suite: str, block: Block, outcome: str) -> None: ...
    def note(self, line: str) -> None: ...


def versions() -> dict:
    out = {"python": platform.python_version()}
    for pkg in ("racecheck", "torch", "pytest"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = ""
    return out


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


class Runner:
    """Executes a RunConfig into config.out; with `resume`, skips the blocks OUT already finished."""

    def __init__(self, config: RunConfig, *, resume: bool = False, nodes=None) -> None:
        self.config = config
        self.nodes = nodes  # node_writer.Writer when the world spans nodes, else None
        self.listener = RunListener()  # what it reports as it goes: the command line's Progress
        self.resume = resume
        self.run_id = uuid.uuid4().hex[:12]
        self.versions = versions()
        self.counts = LiveCounts()
        self.worktrees = Worktrees(config.out / "worktrees")
        self._session_count = 0
        self._blocks_done = 0
        self._deadline = time.monotonic() + config.max_time if config.max_time else None
        self._stopped = ""
        self._rules_held: list[str] = []  # suites the stop rules ended early
        self._suite: Suite | None = None
        self._written: collections.Counter = collections.Counter()  # records per block this attempt
        self._worst: dict[tuple, Outcome] = {}  # per block: its worst record so far, over sessions
        self._lock = state.Lock(config.out)
        self._folder = HeldFolder(config.out, self._lock, note=lambda line: self.listener.note(line))

    # -- the run ----------------------------------------------------------------------------------
    def run(self) -> RunResult:
        out = self.config.out
        try:
            out.mkdir(parents=True, exist_ok=True)
            linked = run_location.linked_entry(out)
            if linked:  # a file the run would write through into one outside its folder
                raise InputError(f"cannot run in {out}: {linked}")
            killed = self._lock.acquire()
        except state.FolderInUse as exc:
            raise InfrastructureError(str(exc)) from None
        except OSError as exc:
            raise InputError(f"cannot write to the run folder {out}: {exc.strerror or exc}") from None
        if not self.resume and (out / "trials.jsonl").exists() and (out / "trials.jsonl").stat().st_size:
            self._lock.release()
            raise InputError(f"{out} already holds a run; choose another --out, or continue it: {resume_command(out)}")
        if killed:
            self.listener.note(f"killed the session a previous runner left running (pid {killed[0]})")
        try:
            done = self._load_done() if self.resume else {}  # read before this attempt changes run.json
            self._folder.write_run(self._run_json())
            self.listener.planned(self._planned(done) + len(done), len(done))
            self._folder.open_logs()
            try:
                for suite in self.config.scenarios:
                    if self._stopped in ("max-time", "node lost"):
                        break
                    self._run_suite(suite, self._pending(suite, done))
                self._folder.check()  # the last test may have removed it: the summary goes there
            finally:
                self._folder.close()
        finally:
            self.worktrees.cleanup()
            self._lock.release()
        stopped = self._stopped or ("stop rules" if self._rules_held else "")
        return RunResult(self.run_id, self._blocks_done, stopped)

    def _run_json(self) -> dict:
        """run.json for this attempt: the run's settings, with this attempt added to a resumed run's."""
        attempt = {"run_id": self.run_id, "started": _now(), "trials": self.config.trials, "versions": self.versions}
        data = state.read_run(self.config.out) if self.resume else {}
        data.update(self.config.to_json())
        data["attempts"] = data.get("attempts", []) + [attempt]
        data.setdefault("run_id", self.run_id)
        return data

    def _load_done(self) -> dict:
        """The finished blocks of an earlier attempt, their records priming the live counts. Lines
        of the log that are not JSON are removed first, and a block that lost records with them
        runs again. InputError (exit 2) when the log holds JSON that is not a trial record."""
        out = self.config.out
        log = out / "trials.jsonl"
        try:
            bad = repair_log(log)
            folder = open_run_folder(out)  # each record and block within the run's plan
            records = list(folder.records()) if log.exists() else []
            completed = folder.completed
        except ValueError as exc:
            raise InputError(f"cannot resume {out}: {exc}") from None
        for b in bad:
            self.listener.note(f"{log}: {b.describe()}: removed (kept in {log.name}.rejected)")
        written = collections.Counter((r.scenario, r.arm, r.trial) for r in records)
        done = {}
        for key, (outcome, expected) in completed.items():
            if expected is not None and written[key] < expected:
                self.listener.note(
                    f"{key[0]}: trial {key[2]} of arm {key[1]!r} lost "
                    f"{expected - written[key]} of its {expected} records; it runs again"
                )
                continue
            done[key] = outcome
        try:
            for r in records:
                self.counts.record(r.scenario, r.arm, r.trial, r.outcome)
            for (suite, arm, trial), outcome in done.items():
                self.counts.block(suite, arm, trial, outcome)
        except ValueError as exc:  # an unknown outcome
            raise InputError(f"cannot resume {out}: {exc}") from None
        return done

    def _pending(self, suite: Suite, done: dict) -> Iterator[Block]:
        """The blocks still to run, one at a time (a million trials are not planned up front)."""
        c = self.config
        trials = c.shard.trials(c.trials)
        every = blocks.blocks(c.arms_for(suite), trials, seed=c.seed, order=c.order)
        return (b for b in every if (suite.name, b.arm, b.trial) not in done)

    def _planned(self, done: dict) -> int:
        """How many blocks _pending yields, over every suite, counted without listing them."""
        c = self.config
        trials = c.shard.trials(c.trials)
        total = 0
        for s in c.scenarios:
            arms = set(c.arms_for(s))
            total += (trials.stop - trials.start) * len(arms)  # len() of a range stops at 2**63
            total -= sum(1 for name, arm, t in done if name == s.name and arm in arms and t in trials)
        return total

    def _run_suite(self, suite: Suite, pending: Iterator[Block]) -> None:
        c = self.config
        self._suite = suite
        if self.counts.met(suite.name, c.stop_rules):
            return
        groups: dict[tuple, list[str]] = {}
        for arm in c.arms_for(suite):
            groups.setdefault(suite.arm(arm).process_key, []).append(arm)
        queue = blocks.sessions(
            pending,
            groups=[tuple(g) for g in groups.values()],
            isolation=c.isolation,
            chunk=c.chunk,
            seed=c.seed,
            order=c.order,
        )
        retry: SessionPlan | None = None
        while not self._stopped:
            plan = retry or next(queue, None)
            if plan is None or self._should_stop():
                break
            result = self._run_session(suite, plan)
            retry = None
            if result.ending is not Ending.STOPPED and result.remaining:
                # Crashed, hung, or ended early: the rest of its blocks run in a fresh session,
                # a block it ended in after the tests it recorded ([Note: resumed blocks]).
                retry = SessionPlan(tuple(result.remaining))
        if self._stopped == "stop rules":
            self._rules_held.append(suite.name)
            self._stopped = ""  # the rules stop this suite; the next one starts afresh

    def _should_stop(self) -> bool:
        if self.nodes is not None and self.nodes.lost:
            self._stopped = "node lost"
        elif self._deadline is not None and time.monotonic() >= self._deadline:
            self._stopped = "max-time"
        elif self._suite is not None and self.counts.met(self._suite.name, self.config.stop_rules):
            self._stopped = "stop rules"
        return bool(self._stopped)

    # -- one session ------------------------------------------------------------------------------
    def _run_session(self, suite: Suite, plan: SessionPlan):
        k = self._session_count = self._session_count + 1
        sid = f"{self.run_id}-{k}"
        out = self.config.out
        with self._folder.writing("ranks"):
            spec = self._session_spec(suite, plan, sid)
        peers = None
        if self.nodes is not None:  # every node starts its part of the world (nodes.py)
            spec = dataclasses.replace(spec, rendezvous=self.nodes.spec.torchrun_args(sid, spec.world_size))
            peers = self.nodes.session(sid, suite.name, plan)
        run = SessionRun(
            spec,
            plan,
            files=out / "ranks" / sid,
            timeout=self.config.timeout,
            on_merged=lambda merged: self._record(suite, merged),
            on_block=lambda block, outcome: self._block(suite, block, outcome),
            should_stop=self._should_stop,
            on_start=self._folder.session,
            peers=peers,
        )
        try:
            result = run.run()
        except BaseException:
            with contextlib.suppress(FolderFault):  # the fault (or the interrupt) in flight is the one to tell
                self._folder.session(None)
            raise
        self._folder.session(None)
        return result

    def session_spec(self, suite: Suite, plan: SessionPlan, sid: str) -> launch.SessionSpec:
        """What a session of `plan` runs on this node (a follower node runs the writer's plans)."""
        return self._session_spec(suite, plan, sid)

    def _session_spec(self, suite: Suite, plan: SessionPlan, sid: str) -> launch.SessionSpec:
        c = self.config
        arm = suite.arm(plan.arms[0])  # every arm of a plan has the same process_key
        ranks = c.out / "ranks"
        # Every block carries its arm's canonical spec [Note: resolved specs].
        specs = {a: c.spec_for(suite, a) for a in plan.arms}
        write_schedule(
            ranks / f"{sid}.schedule.json", (dataclasses.replace(b, perturb=specs[b.arm]) for b in plan.blocks)
        )
        targets, _ = split_targets(c.pytest_args, suite.run_root)
        user = list(suite.targets if not targets else ()) + list(suite.pytest_args) + list(arm.pytest_args)
        user += list(c.pytest_args)
        # `-p racecheck` loads the plugin even where PYTEST_DISABLE_PLUGIN_AUTOLOAD is set.
        args = list(user) + [
            "-p",
            "racecheck",
            "-p",
            "no:cacheprovider",
            "-q",
            "-rN",
            "--no-header",
            names.arg(names.SCHEDULE, ranks / f"{sid}.schedule.json"),
            names.arg(names.SEED, c.seed),
            names.arg(names.LOG, f"{ranks / sid}-rank-{{rank}}.jsonl"),
            names.arg(names.STOP_FILE, f"{ranks / sid}.stop"),
        ]
        if not any(a == "--tb" or a.startswith("--tb=") for a in user):
            # Python's own tracebacks in the session log: pytest's long ones parse the source of
            # every frame (seconds per rank for a failing trial); the record's signature and
            # message come from the exception, not from this text.
            args.append("--tb=native")
        if suite.kind is SuiteKind.PROJECT:  # patch mode, not the injector
            args += [names.arg(names.PATCH), names.arg(names.HANDOFFS, c.out / "handoffs")]
        if len(plan.blocks) > 1:
            args.append(names.arg(names.STEPS, len(plan.blocks)))
        if c.detect:
            args.append(names.arg(names.DETECT))
        env = self._lock.session_env()  # proves the session this runner's to a later one (state.Lock)
        cwd = suite.run_root
        if suite.kind is SuiteKind.SCENARIO:
            env["OMP_NUM_THREADS"] = "1"
            args.append(f"--rootdir={cwd}")
        if arm.git:
            cwd = self.worktrees.cwd_for(suite.run_root, c.revisions[f"{suite.name}/{arm.name}"])
            env["PYTHONPATH"] = pythonpath(cwd, os.environ.get("PYTHONPATH"))
            args = [f"--rootdir={cwd}" if a.startswith("--rootdir=") else a for a in args]
        if c.backend != "auto":
            env[names.BACKEND_VAR] = c.backend
        if c.mesh is not None:  # the world's size travels as torchrun's WORLD_SIZE (launch.py)
            env.update(c.mesh.env())
        env.update(dict(arm.env))
        return launch.SessionSpec(
            world_size=c.world_for(suite),
            pytest_args=tuple(args),
            env=env,
            cwd=cwd,
            log_path=c.out / "logs" / f"session-{sid}.log",
            user_args=tuple(user),
        )

    # -- what a session reports --------------------------------------------------------------------
    def _record(self, suite: Suite, merged: TestOutcome) -> None:
        c = self.config
        arm, trial, test = merged.arm, merged.trial, merged.test
        params = merged.params or (test[test.index("[") + 1 : -1] if test.endswith("]") else "")
        record = TrialRecord(
            run_id=self.run_id,
            scenario=suite.name,
            arm=arm,
            expect=suite.arms[arm].expect if arm in suite.arms else "",
            trial=trial,
            seed=c.seed + trial,
            test=test,
            params=params,
            outcome=merged.outcome,
            signature=merged.signature,
            message=merged.message,
            duration=merged.duration,
            device=merged.device,
            perturb=merged.perturb or c.spec_for(suite, arm),
            detect=c.detect,
            detected=merged.detected,
            reports=merged.reports,
            actions=merged.actions,
            delayed=merged.delayed or [],
            handoffs=merged.handoffs,
            unseen_kernels=merged.unseen_kernels,
            detector_errors=merged.detector_errors,
            racecheck_frame=merged.racecheck_frame or "",
            versions=self.versions,
            time=_now(),
        )
        if Outcome(record.outcome).is_failure:
            record.replay = replay_command(record, suite=suite, config=c)
        self._folder.append_record(record)
        self._written[(suite.name, arm, trial)] += 1
        key = (suite.name, arm, trial)
        self._worst[key] = worst([self._worst.get(key, Outcome.PASSED), record.outcome])
        self.counts.record(suite.name, arm, trial, record.outcome)
        self.listener.record(record)

    def _block(self, suite: Suite, block: Block, outcome: Outcome) -> None:
        # A block resumed after a crash or a hang: its outcome is the worst over its sessions.
        outcome = worst([outcome, self._worst.pop((suite.name, block.arm, block.trial), outcome)])
        written = self._written.pop((suite.name, block.arm, block.trial), 0)
        self._folder.append_block(suite.name, block, outcome.value, self.run_id, records=written)
        self._blocks_done += 1
        self.counts.block(suite.name, block.arm, block.trial, outcome.value)
        self.listener.block(suite.name, block, outcome.value)
