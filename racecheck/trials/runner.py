"""The trial runner: runs a scenario's suite under its arms for many trials and logs every outcome.

Two isolation modes:
- `session` (default, fast): one pytest session (one process world) runs every trial; pytest-repeat
  repeats the suite and the plugin alternates the arms trial by trial (A B A B). Trials share a
  process, so state that leaks between tests (allocator pools, warm caches) is shared too.
- `process`: a fresh process world per trial and arm; trials are independent, at the price of one
  process start-up (torch import, process-group rendezvous) per trial.

Outcomes are appended to OUT/trials.jsonl as each test finishes on every rank. A session that hangs
(no test finished within --timeout) is killed with its whole process tree, the test in flight is
recorded as `timeout`, and the run goes on with the next trial.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import platform
import shlex
import time
import uuid
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

from racecheck.exitcodes import InfrastructureError
from racecheck.trials import launch
from racecheck.trials.catalogue import Scenario
from racecheck.trials.ranks import RankMerger, RankTail
from racecheck.trials.record import Outcome, TrialLog, TrialRecord

ISOLATION_MODES = ("session", "process")


@dataclasses.dataclass(frozen=True)
class RunConfig:
    scenarios: tuple[Scenario, ...]
    arms: tuple[str, ...] | None  # None: each scenario's default arms
    trials: int
    out: Path
    perturb: str | None = None  # None: each scenario's default profile
    seed: int = 0
    isolation: str = "session"
    timeout: float = 300.0  # seconds without a finished test before a session counts as hung
    backend: str = "auto"
    detect: bool = False
    pytest_args: tuple[str, ...] = ()
    all_arms: bool = False  # every arm of each scenario (for --scenario all)

    def arms_for(self, scenario: Scenario) -> tuple[str, ...]:
        if self.arms:
            return self.arms
        return tuple(scenario.arms) if self.all_arms else scenario.default_arms

    def perturb_for(self, scenario: Scenario) -> str:
        return scenario.default_perturb if self.perturb is None else self.perturb


@dataclasses.dataclass(frozen=True)
class Session:
    scenario: Scenario
    arms: tuple[str, ...]
    trial_start: int
    trials: int


def versions() -> dict:
    out = {"python": platform.python_version()}
    for pkg in ("racecheck", "torch", "pytest"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = ""
    return out


class Runner:
    """Executes a RunConfig; `on_record` is called with every TrialRecord as it is logged."""

    def __init__(self, config: RunConfig, *, on_record: Callable[[TrialRecord], None] = lambda r: None,
                 on_expected: Callable[[int], None] = lambda n: None) -> None:
        self.config = config
        self.on_record = on_record
        self.on_expected = on_expected
        self.run_id = uuid.uuid4().hex[:12]
        self.versions = versions()
        self._session_count = 0

    def plan(self, scenario: Scenario) -> list[Session]:
        arms = self.config.arms_for(scenario)
        if self.config.isolation == "process":
            return [Session(scenario, (arm,), t, 1) for t in range(self.config.trials) for arm in arms]
        return [Session(scenario, arms, 0, self.config.trials)]

    def run(self) -> None:
        out = self.config.out
        out.mkdir(parents=True, exist_ok=True)
        (out / "run.json").write_text(json.dumps(self._describe(), indent=2) + "\n")
        with TrialLog(out / "trials.jsonl") as log:
            for scenario in self.config.scenarios:
                queue = self.plan(scenario)
                while queue:
                    session = queue.pop(0)
                    last_trial = self._run_session(session, log)
                    end = session.trial_start + session.trials
                    if last_trial is not None and last_trial + 1 < end:
                        # The session ended early (hang or crash): go on with the next trial.
                        queue.insert(0, Session(scenario, session.arms, last_trial + 1, end - last_trial - 1))

    def _describe(self) -> dict:
        c = self.config
        return {"run_id": self.run_id, "trials": c.trials, "seed": c.seed, "isolation": c.isolation,
                "timeout": c.timeout, "backend": c.backend, "detect": c.detect,
                "pytest_args": list(c.pytest_args),
                "scenarios": {s.name: {"arms": list(c.arms_for(s)), "perturb": c.perturb_for(s)}
                              for s in c.scenarios},
                "versions": self.versions,
                "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}

    # -- one session -----------------------------------------------------------------------------
    def _session_spec(self, session: Session, rank_pattern: Path, log_path: Path) -> launch.SessionSpec:
        c, s = self.config, session
        count = s.trials * len(s.arms)
        targets = [a for a in c.pytest_args if not a.startswith("-")]
        args = [] if targets else [str(s.scenario.path)]
        args += list(c.pytest_args)
        args += ["-p", "racecheck", "-p", "no:cacheprovider", "-q", "-rN", "--no-header",
                 f"--rootdir={s.scenario.path.parent.parent}",
                 f"--racecheck-arms={','.join(s.arms)}", f"--racecheck-trial-start={s.trial_start}",
                 f"--racecheck-seed={c.seed}", f"--racecheck-perturb={c.perturb_for(s.scenario)}",
                 f"--racecheck-log={rank_pattern}"]
        if count > 1:
            args += [f"--count={count}", "--repeat-scope=session"]
        if c.detect:
            args.append("--racecheck-detect")
        env = {"OMP_NUM_THREADS": "1"}
        if c.backend != "auto":
            env["RACECHECK_BACKEND"] = c.backend
        for arm in s.arms:
            env.update(dict(s.scenario.arm(arm).env))
        return launch.SessionSpec(world_size=s.scenario.world_size, pytest_args=tuple(args), env=env,
                                  cwd=s.scenario.path.parent.parent, log_path=log_path)

    def _run_session(self, session: Session, log: TrialLog) -> int | None:
        """Run one session; returns the last trial index it reached if it ended early, else None."""
        k = self._session_count = self._session_count + 1
        out = self.config.out
        rank_pattern = out / "ranks" / f"session-{k}-rank-{{rank}}.jsonl"
        spec = self._session_spec(session, rank_pattern, out / "logs" / f"session-{k}.log")
        world = spec.world_size
        tails = [RankTail(Path(str(rank_pattern).replace("{rank}", str(r)))) for r in range(world)]
        merger = RankMerger(world)
        try:
            proc = launch.start(spec)
        except OSError as exc:
            raise InfrastructureError(f"could not start pytest: {exc}") from None
        last_progress = time.monotonic()
        last_trial = session.trial_start
        any_outcome = False
        ended: Outcome | None = None
        while True:
            exited = proc.poll() is not None
            for tail in tails:
                for event in tail.read():
                    if event.get("event") == "collected" and event.get("rank", 0) == 0:
                        self.on_expected(int(event["count"]))
                    merged = merger.add(event)
                    if event.get("event") in ("start", "outcome"):
                        last_progress = time.monotonic()
                    if merged is not None:
                        any_outcome = True
                        last_trial = max(last_trial, merged["trial"])
                        self._log(session.scenario, merged, log)
            if exited:
                break
            if time.monotonic() - last_progress > self.config.timeout:
                launch.kill_tree(proc)
                ended = Outcome.TIMEOUT
                break
            time.sleep(0.05)
        rc = proc.returncode
        if ended is None and rc not in (0, None):
            ended = Outcome.CRASH
        if ended is not None:
            for merged in merger.abandon(ended):
                any_outcome = True
                last_trial = max(last_trial, merged["trial"])
                self._log(session.scenario, merged, log)
            if not any_outcome:
                tail = _last_lines(spec.log_path)
                raise InfrastructureError(f"the pytest session exited with code {rc} before any test "
                                          f"finished; see {spec.log_path}: {tail}")
            return last_trial
        if not any_outcome:
            raise InfrastructureError(f"the pytest session ran no test (exit code {rc}); see {spec.log_path}")
        return None

    def _log(self, scenario: Scenario, merged: dict, log: TrialLog) -> None:
        c = self.config
        arm = merged["arm"]
        expect = scenario.arms[arm].expect if arm in scenario.arms else ""
        perturb = c.perturb_for(scenario)
        record = TrialRecord(
            run_id=self.run_id, scenario=scenario.name, arm=arm, expect=expect, trial=merged["trial"],
            seed=merged["seed"], test=merged["test"], params=merged["params"], outcome=merged["outcome"],
            signature=merged["signature"], message=merged["message"], duration=merged["duration"],
            device=merged.get("device", "cpu"), perturb=perturb, detect=c.detect,
            detected=merged["detected"], reports=merged["reports"], versions=self.versions,
            time=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
        if Outcome(record.outcome).is_failure:
            record.replay = replay_command(record, scenario=scenario.name, perturb=perturb,
                                           detect=c.detect, backend=c.backend)
        log.append(record)
        self.on_record(record)


def replay_command(record: TrialRecord, *, scenario: str, perturb: str, detect: bool, backend: str) -> str:
    """One command line that reruns exactly this test of this trial under this arm."""
    parts = ["racecheck", "run", "--scenario", scenario, "--arms", record.arm, "--trials", "1",
             "--seed", str(record.seed), "--perturb", perturb or "off"]
    if detect:
        parts.append("--detect")
    if backend != "auto":
        parts += ["--backend", backend]
    parts += ["--", record.test]
    return shlex.join(parts)


def _last_lines(path: Path, n: int = 3) -> str:
    try:
        lines = [l for l in path.read_text(errors="replace").splitlines() if l.strip()]
    except OSError:
        return ""
    return " | ".join(lines[-n:])[-400:]
