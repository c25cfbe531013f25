"""The README's promises about whole runs, each checked through `racecheck run` as a user runs it
(the catalogue's, every scenario in one run: test_catalogue_promise.py):

- the systematic schedule finds a real race of the CPU emulation within k trials (k the hand-off
  points trial 0 recorded), and never fails the arm that synchronizes;
- a multi-rank session and its ranks die with the runner, even when the runner is SIGKILLed;
- a multi-rank session whose rank failed at setup ends within the fail-fast bound (FAILFAST_S),
  the error is its arm's record, and the rest of the plan runs in a fresh session.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import psutil
import pytest
from run_kit import racecheck, write_suite

from racecheck.runner import session
from racecheck.runner.trial_log import read_log

pytestmark = pytest.mark.usefixtures("fast_sessions")


# -- the systematic schedule on the CPU emulation --------------------------------------------------
# patch mode picks its actions from $RACECHECK_PATCH_ACTIONS (the recording twin) or CUDA; this
# conftest hands it the CPU emulation's instead (RuntimeActions, as the soundness check uses),
# so the schedule's delays are real stream work and the race below is the emulation's own.
EMULATION_CONFTEST = """
import pytest
import racecheck.rank.project
from racecheck.device.sim import SimRuntime
from racecheck.perturb.runtime_actions import RuntimeActions

RUNTIME = SimRuntime()


class EmulationActions(RuntimeActions):
    def __init__(self):
        super().__init__(RUNTIME)


racecheck.rank.project.actions_factory = lambda *, need: EmulationActions


@pytest.fixture
def rt():
    return RUNTIME
"""

# A side stream fills `out`; arm `race` reads it on the host after a pause long enough for the
# fill to have run, with no wait; arm `safe` makes the default stream wait for the side stream.
# A delay the schedule puts on the side stream (at its wait or its entry) makes the race read zeros.
HANDOFF_TEST = """
import time
import torch


def test_side_stream_output(rt, racecheck_arm):
    side = rt.new_stream("side")
    out = rt.zeros(256)
    side.wait_stream(rt.default_stream())
    with rt.stream(side):  # SIDE_ENTER
        rt.launch("produce", lambda o: o.fill_(1.0), writes=(out,))
    if racecheck_arm == "safe":
        rt.default_stream().wait_stream(side)
    else:
        time.sleep(0.2)
    assert torch.equal(out, torch.ones(256)), "read the side stream's output before it was written"
"""
SIDE_ENTER = 1 + HANDOFF_TEST.split("\n").index(next(ln for ln in HANDOFF_TEST.split("\n") if "SIDE_ENTER" in ln))


def test_the_systematic_schedule_finds_a_race_of_the_emulation_within_k_trials(tmp_path, monkeypatch):
    monkeypatch.setenv("RACECHECK_PATCH_ACTIONS", "recording")  # the runner's check: patch mode can act
    root = write_suite(
        tmp_path / "p",
        arms={"race": {"expect": "race"}, "safe": {"expect": "safe"}},
        tests={"conftest.py": EMULATION_CONFTEST, "test_handoff.py": HANDOFF_TEST},
    )
    out = tmp_path / "out"
    trials = 6  # the safe arm passes 5 points (both sides of two waits, the side stream's entry)
    res = racecheck(
        "run", "--trials", trials, "--perturb", "systematic:delay=400ms:pairs=0", "--out", out, "-q", cwd=root
    )
    assert res.code == 0, res
    got = {(r.arm, r.trial): r for r in read_log(out / "trials.jsonl")}
    k, k_safe = got["race", 0].handoffs, got["safe", 0].handoffs
    assert k is not None and k_safe is not None and k < trials and k_safe < trials, (k, k_safe)
    assert got["race", 0].outcome == "passed"  # trial 0 delays nothing: no natural failure
    failing = [t for t in range(trials) if got["race", t].outcome == "failed"]
    assert failing and failing[0] <= k, f"no failure within k={k} trials: {failing}"
    # Every point of the race arm is on the side stream, ahead of its fill: each one exposes it.
    assert failing[:k] == list(range(1, k + 1)) and all(got["race", t].actions["sleep"] >= 1 for t in failing)
    enter = f"stream_enter@test_handoff.py:{SIDE_ENTER}/s1"
    assert [enter] in [got["race", t].delayed for t in failing]
    # The safe arm, every one of its points delayed in turn, never fails.
    assert [got["safe", t].outcome for t in range(trials)] == ["passed"] * trials
    assert f"tiny/race: systematic: k={k} points" in res.out and f"first failure in trial {failing[0]}" in res.out
    assert "tiny/safe: systematic" in res.out and "no delayed trial failed" in res.out


# -- sessions and the runner's death ---------------------------------------------------------------
TWO_RANKS_WAIT = """
import time


def test_wait():
    time.sleep(120)
"""


def _ranks_of(runner: psutil.Process, world: int, limit: float = 120.0) -> list[psutil.Process]:
    """The session's processes below `runner` once its `world` ranks run (torchrun included)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        family = runner.children(recursive=True)
        ranks = [p for p in family if _environ(p).get("LOCAL_RANK") is not None and "pytest" in _cmd(p)]
        if len(ranks) >= world:
            return family
        assert runner.is_running(), "the run ended before its ranks started"
        time.sleep(0.2)
    raise AssertionError(f"fewer than {world} ranks below the runner after {limit} s")


def _environ(p: psutil.Process) -> dict:
    try:
        return p.environ()
    except psutil.Error:
        return {}


def _cmd(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.slow
def test_sigkill_of_the_runner_leaves_no_rank_of_a_two_rank_session(tmp_path):
    root = write_suite(
        tmp_path / "p", arms={"only": {}}, tests={"test_wait.py": TWO_RANKS_WAIT}, suite="world_size = 2"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "racecheck", "run", "--trials", "1", "--out", str(tmp_path / "out"), "-q"],
        cwd=root,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        family = _ranks_of(psutil.Process(proc.pid), world=2)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    deadline = time.monotonic() + 15.0
    while any(_alive(p) for p in family) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [(p.pid, _cmd(p)[:4]) for p in family if _alive(p)]
    for p in family:  # never leave them to the rest of the suite, whatever the verdict
        if _alive(p):
            p.kill()
    assert not left, f"alive 15 s after the runner was SIGKILLed: {left}"


# Rank 1 raises in a session fixture before it joins its world: rank 0 waits for a peer that never
# comes, as it would in init_process_group's rendezvous (whose own timeout is 30 minutes). No
# torch in the ranks: the fault is the runner's to handle, and their imports would only add time.
RANK_FAILS_AT_SETUP = """
import os
import time
import pytest


@pytest.fixture(scope="session")
def world():
    if os.environ["RANK"] == "1":
        with open(os.environ["FAILED_AT"], "w") as f:
            f.write(repr(time.time()))
        raise RuntimeError("rank 1 could not set up")  # RAISED
    time.sleep(600)  # rendezvous with rank 1
    yield


def test_barrier(world):
    pass
"""
RAISED = 1 + RANK_FAILS_AT_SETUP.split("\n").index(next(ln for ln in RANK_FAILS_AT_SETUP.split("\n") if "RAISED" in ln))
FAILFAST_MARGIN_S = 5.0  # the kill's grace (3 s), the poll, writing the run folder


@pytest.mark.slow
def test_a_rank_failing_at_setup_ends_its_session_within_the_fail_fast_bound_and_is_the_error(tmp_path, monkeypatch):
    """Two arms, so two sessions: the first is killed as a broken world and the rest of the plan
    runs in a fresh one, where rank 1 fails again; each arm records rank 1's error."""
    # The bound is FAILFAST_S, whatever its value: half a second stands for the default's five.
    monkeypatch.setattr(session, "FAILFAST_S", 0.5)
    failed_at = tmp_path / "failed_at"
    monkeypatch.setenv("FAILED_AT", str(failed_at))
    root = write_suite(
        tmp_path / "p",
        arms={"a": {"env": {"ARM": "a"}}, "b": {"env": {"ARM": "b"}}},
        tests={"test_world.py": RANK_FAILS_AT_SETUP},
        suite="world_size = 2",
    )
    res = racecheck("run", "--arms", "a,b", "--trials", 1, "--out", tmp_path / "out", "-q", cwd=root)
    ended = time.time()
    assert res.code == 0, res
    got = list(read_log(tmp_path / "out" / "trials.jsonl"))
    assert sorted(r.arm for r in got) == ["a", "b"]
    for r in got:
        assert r.outcome == "error" and r.message.startswith("rank 1: rank 1 could not set up"), r
        assert r.signature == f"RuntimeError at test_world.py:{RAISED} in world", r
    assert "of these 1 errored" in res.out
    # The last session, from its rank's failure to the end of the run.
    elapsed = ended - float(failed_at.read_text())
    assert session.FAILFAST_S <= elapsed < session.FAILFAST_S + FAILFAST_MARGIN_S, (
        f"the session ended {elapsed:.1f} s after the failure"
    )
