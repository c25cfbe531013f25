"""Worlds across nodes on one machine: two `racecheck run` processes as two nodes (one rank each,
gloo, a localhost c10d rendezvous) give the outcomes and counts of the two-rank world; a node
that is killed ends its trial as a crash and both nodes resume the run to its end; a node that
never joins, or runs another experiment, ends the run cleanly instead of hanging."""

from __future__ import annotations

import collections
import json
import random
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from run_kit import Result, free_port, racecheck, records, summary_counts, write_suite

from racecheck.protocol.records import Outcome
from racecheck.runner import node_writer

# Each rank draws; the world fails a test when any rank's draw was unlucky (an all-reduce, so
# both nodes must take part). test_rank_one fails on rank 1 alone: its outcome crosses the nodes.
WORLD_TEST = """
import random, time
import pytest
import torch
import torch.distributed as dist

RATES = {"often": 0.4, "never": 0.0}

@pytest.fixture(scope="session")
def rank():
    dist.init_process_group("gloo")
    yield dist.get_rank()
    dist.destroy_process_group()

@pytest.mark.parametrize("case", ["x", "y"])
def test_draw(rank, case, racecheck_arm, racecheck_seed):
    unlucky = random.Random(f"{racecheck_seed}-{case}-{rank}").random() < RATES[racecheck_arm]
    flag = torch.tensor([float(unlucky)])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    assert flag.item() == 0, "unlucky draw"

def test_rank_one(rank, racecheck_seed):
    time.sleep(float(__import__("os").environ.get("STEP_S", "0")))
    flag = torch.ones(1)
    dist.all_reduce(flag)
    assert not (rank == 1 and racecheck_seed % 2), "rank 1 disagrees"
"""
RATES = {"often": 0.4, "never": 0.0}
LIMIT_S = 120  # no command here may hang: each is killed after this long


pytestmark = [pytest.mark.usefixtures("fast_sessions"), pytest.mark.slow]


@pytest.fixture
def world_project(tmp_path):
    return write_suite(
        tmp_path / "p",
        arms={"often": {"expect": "race"}, "never": {"expect": "safe"}},
        tests={"test_world.py": WORLD_TEST},
        suite="world_size = 2",
    )


# A node is lost after 4 s without a heartbeat (c10d's default is 15 s): soon enough for the
# killed-node test, and not as soon as 2 s, with which, once in seven runs of the whole suite (its
# workers start process worlds beside these tests), node 0's torchrun found a node waiting to join
# a rendezvous both had completed, restarted its workers and waited for the other node in vain.
KEEP_ALIVE = "keep_alive_interval=1,keep_alive_max_attempt=4"


def node_args(port: int, rank: int, *, conf: str = f"join_timeout=30,{KEEP_ALIVE}"):
    return ["--nnodes", "2", "--node-rank", str(rank), "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-conf", conf]


def start_node(root, args) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "racecheck", "run", *map(str, args)],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def kill_node(proc: subprocess.Popen) -> None:
    """A node's death: its racecheck process, torchrun and every rank at once."""
    root = psutil.Process(proc.pid)
    family = root.children(recursive=True) + [root]
    for p in family:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def finish_node(proc: subprocess.Popen, *, limit: float = LIMIT_S) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of a node once it has ended (killed after `limit` seconds)."""
    out, err = proc.communicate(timeout=limit)
    return proc.returncode, out, err


def nodes_with_node_0_here(root, node_0: list, others: list[list]) -> tuple[Result, list[tuple[int, str, str]]]:
    """Node 0's `racecheck run` in this process and every other node's in a process of its own,
    all at once: node 0's Result and (exit code, stdout, stderr) of each other node."""
    procs = [start_node(root, args) for args in others]
    try:
        res = racecheck("run", *node_0, cwd=root)
        return res, [finish_node(p) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                kill_node(p)


def outcome_of(arm: str, trial: int, *, seed: int) -> dict:
    """{test: whether it fails} for one trial of WORLD_TEST over two ranks."""
    fails = {
        f"test_draw[{c}]": any(random.Random(f"{seed + trial}-{c}-{r}").random() < RATES[arm] for r in (0, 1))
        for c in ("x", "y")
    }
    fails["test_rank_one"] = bool((seed + trial) % 2)
    return fails


def test_a_killed_node_ends_its_trial_as_crash_the_other_reports_it_and_resume_finishes(
    world_project, tmp_path, monkeypatch
):
    monkeypatch.setenv("STEP_S", "0.2")
    out = tmp_path / "out"
    writer, killed = _killing_node_1_after_four_records(world_project, out)
    assert killed, f"the writer ended before four records: {writer}"
    assert writer.code == 3, writer
    assert (
        "node 1 stopped responding" in writer.err
        and f"continue with this on every node: racecheck run --resume {out}" in writer.err
    ), writer
    recs = records(out)
    bad = [r for r in recs if r.outcome in ("crash", "error")]
    # The trial in flight is blamed, naming the node; every trial before it is whole.
    crashed = max(r.trial for r in recs)
    assert bad and {r.trial for r in bad} == {crashed}
    assert all("node 1" in r.signature for r in bad if r.outcome == "crash")
    assert (out / "summary.csv").exists() and crashed < 11
    assert not [p for p in psutil.process_iter(["cmdline"]) if str(out) in " ".join(p.info["cmdline"] or [])]
    # Both nodes resume the run: the trials after the crash run; the crashed block stays crashed.
    # Nothing is killed from here on, so the tests need not be slowed down any longer. Node 0
    # runs in this process (a racecheck run as any other; torch is loaded here already), node 1
    # in one of its own.
    monkeypatch.setenv("STEP_S", "0")
    follower_dir = out / "nodes" / "node-1"
    killed_logs = set((follower_dir / "ranks").glob("*-rank-*.jsonl"))
    writer_logs_before = set((out / "ranks").glob("*-rank-*.jsonl"))
    port = free_port()
    writer, done = nodes_with_node_0_here(
        world_project, ["--resume", out, "-q"] + node_args(port, 0), [["--resume", out, "-q"] + node_args(port, 1)]
    )
    assert writer.code == 0 and [d[0] for d in done] == [0], (writer, done)
    assert "ran its part of 1 session(s) of node 0's run" in done[0][1], done
    _check_the_resumed_run(out, blamed={(r.trial, r.arm) for r in bad})
    # Node 1 kept its own rank log of the resumed session and no trial log. c10d, not the node
    # rank, decides which global rank node 1's process gets, so its log may be rank 0's or rank
    # 1's; node 0 holds the same events under the same name, relayed, beside its own rank's log.
    assert not (follower_dir / "trials.jsonl").exists()
    (kept,) = set((follower_dir / "ranks").glob("*-rank-*.jsonl")) - killed_logs
    writer_logs = sorted(p.name for p in set((out / "ranks").glob("*-rank-*.jsonl")) - writer_logs_before)
    assert len(writer_logs) == 2 and kept.name in writer_logs, writer_logs

    def events(path):
        return [json.loads(line) for line in path.read_text().splitlines()]

    assert events(kept) and events(kept) == events(out / "ranks" / kept.name)
    assert json.loads((follower_dir / "run.json").read_text())["node"] == {"rank": 1, "nnodes": 2}


def _killing_node_1_after_four_records(world_project: Path, out: Path):
    """(node 0's result, whether node 1 was killed) of a run of 12 trials over two nodes, node 1
    killed once node 0 (the writer, running in this process) has logged four records."""
    port = free_port()
    common = ["--trials", 12, "--seed", 4, "--out", out, "-q"]
    follower = start_node(world_project, common + node_args(port, 1))
    killed, writer_done = threading.Event(), threading.Event()

    def kill_after_four_records() -> None:
        deadline = time.monotonic() + LIMIT_S
        log = out / "trials.jsonl"
        while not writer_done.is_set() and time.monotonic() < deadline:
            if log.exists() and len(log.read_text().splitlines()) >= 4:
                kill_node(follower)
                killed.set()
                return
            time.sleep(0.05)

    watcher = threading.Thread(target=kill_after_four_records, daemon=True)
    watcher.start()
    try:
        writer = racecheck("run", *common, *node_args(port, 0), cwd=world_project)
    finally:
        writer_done.set()
        watcher.join()
        if follower.poll() is None:
            kill_node(follower)
        follower.communicate()
    return writer, killed.is_set()


def _check_the_resumed_run(out: Path, *, blamed: set) -> None:
    """Every block done; every trial that ran whole is what WORLD_TEST's two ranks draw
    (`outcome_of`), the outcome one node running both ranks gives (test_runner.py checks that merge
    of ranks), both ranks' failures in node 0's one log; the summary counts them, the `blamed`
    (crashed) blocks as failures."""
    done_blocks = [json.loads(line) for line in (out / "completed.jsonl").read_text().splitlines()]
    assert sorted((d["trial"], d["arm"]) for d in done_blocks) == sorted((t, a) for t in range(12) for a in RATES)
    recs = records(out)
    outcomes = {(r.trial, r.arm, r.test.split("::")[-1]): r.outcome for r in recs}
    assert {k: v for k, v in outcomes.items() if k[:2] not in blamed} == {
        (t, a, test): "failed" if fails else "passed"
        for t in range(12)
        for a in RATES
        for test, fails in outcome_of(a, t, seed=4).items()
        if (t, a) not in blamed
    }
    assert {r.message for r in recs if r.outcome == "failed"} == {"unlucky draw", "rank 1 disagrees"}
    failing: dict[tuple[str, str], dict[int, bool]] = collections.defaultdict(dict)  # (arm, test) -> {trial: failed}
    for (t, a, test), outcome in outcomes.items():
        failed = Outcome(outcome).is_failure
        failing[a, test][t] = failed
        failing[a, "*"][t] = failing[a, "*"].get(t, False) or failed
    assert summary_counts(out) == {key: (sum(per.values()), len(per)) for key, per in failing.items()}


def test_a_node_that_never_joins_stops_the_run_within_the_join_timeout(world_project, tmp_path):
    port = free_port()
    node_0, node_1 = node_args(port, 0, conf="join_timeout=1"), node_args(port, 1, conf="join_timeout=1")
    res = racecheck("run", "--trials", 2, "--out", tmp_path / "out", "-q", *node_0, cwd=world_project)
    assert res.code == 3, res
    assert "node 1 of 2 did not join within 1 s (--rdzv-conf join_timeout)" in res.err
    assert not (tmp_path / "out" / "trials.jsonl").exists()
    res = racecheck("run", "--trials", 2, "--out", tmp_path / "f", "-q", *node_1, cwd=world_project)
    assert res.code == 3 and f"node 1: could not reach node 0 at 127.0.0.1:{port} within 1 s" in res.err, res


def test_a_node_with_other_settings_is_refused_by_both(world_project, tmp_path, monkeypatch):
    # Node 0 keeps its store up for BYE_S after the refusal, for node 1 to read it; node 1 polls
    # it every 50 ms and never says goodbye, so a shorter stay is all this needs.
    monkeypatch.setattr(node_writer, "BYE_S", 2.0)
    port = free_port()
    follower = start_node(world_project, ["--seed", 2, "--out", tmp_path / "out", "-q"] + node_args(port, 1))
    try:
        res = racecheck("run", "--seed", 1, "--out", tmp_path / "out", "-q", *node_args(port, 0), cwd=world_project)
        _, err = follower.communicate(timeout=LIMIT_S)
    finally:
        if follower.poll() is None:
            kill_node(follower)
    message = "node 1 runs another experiment than node 0: its seed is 2, node 0's 1"
    assert res.code == 2 and message in res.err, res
    assert follower.returncode == 2 and message in err and err.count("\n") == 1, err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nnodes", "2"], "--nnodes above 1 needs --rdzv-endpoint HOST:PORT"),
        (["--node-rank", "1"], "--node-rank needs --nnodes above 1"),
        (
            ["--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "h:1"],
            "Invalid value for --node-rank: 2 is not below",
        ),
        (["--nnodes", "2", "--rdzv-endpoint", "h:x"], "Invalid value for --rdzv-endpoint: 'h:x' is not HOST:PORT"),
        (["--nnodes", "2", "--rdzv-endpoint", "h:1", "--rdzv-conf", "is_host=true"], "is_host is racecheck's to set"),
        (
            ["--nnodes", "2", "--rdzv-endpoint", "h:1", "--rdzv-conf", "join_timeout=soon"],
            "Invalid value for --rdzv-conf: join_timeout='soon' is not a whole number of seconds",
        ),
        (["--nnodes", "3", "--rdzv-endpoint", "localhost:1"], "tiny runs 2 ranks, which 3 nodes cannot share evenly"),
        (["--nnodes", "2", "--rdzv-endpoint", "nohostport"], "'nohostport' is not HOST:PORT (node 0's address"),
        (["--nnodes", "2", "--rdzv-endpoint", "h:0"], "'h:0' is not HOST:PORT"),
        (["--nnodes", "2", "--rdzv-endpoint", "tcp://h"], "'tcp://h' is not HOST:PORT"),
        (
            ["--nnodes", "2", "--rdzv-endpoint", "no-such-host.invalid:29500"],
            "no-such-host.invalid:29500: cannot resolve the host 'no-such-host.invalid'",
        ),
    ],
)
def test_bad_node_options_get_one_line_and_exit_2(world_project, args, message):
    res = racecheck("run", "-q", "--out", "o", *args, cwd=world_project)
    assert res.code == 2 and res.err.count("\n") == 1 and message in res.err, res


def test_node_0_refuses_an_endpoint_it_cannot_host_at_once(world_project, tmp_path):
    import time

    with socket.create_server(("", 0)) as taken:  # another program holds the port
        port = taken.getsockname()[1]
        started = time.monotonic()
        res = racecheck("run", "-q", "--out", tmp_path / "o", *node_args(port, 0), cwd=world_project)
    assert res.code == 2 and res.err.count("\n") == 1, res
    assert f"--rdzv-endpoint: cannot host the rendezvous on port {port}: Address already in use" in res.err, res
    assert time.monotonic() - started < 10
