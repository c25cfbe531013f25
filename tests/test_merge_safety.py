"""`racecheck merge` takes its --out as a run does: locked against another merge or run, written
whole or not at all (a SIGTERM, wherever it lands, leaves the folder as it was or whole, with exit
130), never into a folder that holds someone else's files; and a shard whose log is empty is
refused, one that holds fewer trials than it planned is named. The shards are written directly
(bench/folder_races.py's make_shards), so a merge of thousands of records costs no trial."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from run_kit import racecheck

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location("folder_races", ROOT / "bench" / "folder_races.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


make_shards = _bench().make_shards


def _merge(*args, cwd) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "racecheck", "merge", *map(str, args)],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_two_merges_into_one_folder_one_merges_and_the_other_is_refused(tmp_path):
    # Enough records that reading them takes the merges past each other's start.
    alpha = make_shards(tmp_path, suite="alpha", records=6000)
    beta = make_shards(tmp_path, suite="beta", records=6000)
    out = tmp_path / "merged"
    procs = [_merge(*shards, "--out", out, cwd=tmp_path) for shards in (alpha, beta)]
    ends = [(p.wait(timeout=120), p.communicate()[1]) for p in procs]
    codes = [code for code, _ in ends]
    assert sorted(codes) in ([0, 2], [0, 3]), ends  # in use (3), or it already holds the merge (2)
    loser = next(err for code, err in ends if code != 0)
    assert loser.count("\n") == 1 and ("is in use by another racecheck run" in loser or "already holds a run" in loser)
    winner = ("alpha", "beta")[codes.index(0)]
    lines = _lines(out / "trials.jsonl")
    assert len(lines) == 6000 and {json.loads(line)["scenario"] for line in lines} == {winner}
    assert json.loads((out / "run.json").read_text())["merged_from"] == [str(p) for p in (alpha, beta)[codes.index(0)]]


# Where a SIGTERM reaches a merge (signal_at.py: sent when the code gets there), and what it leaves.
SIGNAL_POINTS = {
    "while it stages its files": (["os.fsync", "after"], "is unchanged"),
    "between its renames": (["os.replace", "before", "run.json"], "holds the whole merge"),
    "after its commit": (["racecheck.runner.merge._commit", "after"], "holds the whole merge"),
    "while it writes the summary": (["racecheck.results.tally.write_summary", "before"], "holds the whole merge"),
}


@pytest.mark.parametrize("point", SIGNAL_POINTS)
def test_a_merge_stopped_by_sigterm_exits_130_with_its_folder_as_it_was_or_whole(tmp_path, point):
    signal_at, said = SIGNAL_POINTS[point]
    records = 24
    shards = make_shards(tmp_path, suite="alpha", records=records)
    out = tmp_path / "merged"
    command = [sys.executable, str(ROOT / "tests" / "signal_at.py"), *signal_at, "--"]
    proc = subprocess.run(
        [*command, "merge", *map(str, shards), "--out", str(out)], capture_output=True, text=True, timeout=120
    )
    assert (proc.returncode, proc.stderr) == (130, f"racecheck: interrupted; {out} {said}\n"), proc
    assert not [p.name for p in out.iterdir() if p.name.endswith(".merge")]  # no temporary file left
    assert not (out / "runner.json").exists()
    res = racecheck("report", out, "--format", "csv", cwd=tmp_path)
    if said == "is unchanged":
        assert not (out / "trials.jsonl").exists() and not (out / "run.json").exists()
        assert res.code == 2 and "no trial log" in res.err, res  # not a run of fewer trials
    else:
        assert len(_lines(out / "trials.jsonl")) == records
        assert res.code == 0 and (out / "summary.csv").read_text() == res.out, res  # the summary, whole


def test_a_shard_with_an_empty_log_is_refused_and_one_missing_trials_is_named(tmp_path):
    first, second = make_shards(tmp_path, suite="alpha", records=24)  # 4 trials x 2 arms x 3 tests
    kept = (second / "trials.jsonl").read_text()
    (second / "trials.jsonl").write_text("")
    res = racecheck("merge", first, second, "--out", tmp_path / "m", cwd=tmp_path)
    assert res.code == 2 and res.err.count("\n") == 1, res
    assert f"{second / 'trials.jsonl'} holds no records (shard 2/2 ran no test)" in res.err
    assert not (tmp_path / "m" / "trials.jsonl").exists()
    (second / "trials.jsonl").write_text("".join(kept.splitlines(keepends=True)[:6]))  # trial 2 of 2, 3
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "runner.lock").touch()  # a folder a SIGKILLed merge left: its lock, a temporary file
    (tmp_path / "m" / ".trials.jsonl.1.merge").write_text("{}\n")
    res = racecheck("merge", first, second, "--out", tmp_path / "m", cwd=tmp_path)
    assert res.code == 0, res
    assert f"racecheck: warning: {second} (shard 2/2) holds 2 of the 4 trials it planned" in res.err
    assert (
        not (tmp_path / "m" / ".trials.jsonl.1.merge").exists() and len(_lines(tmp_path / "m" / "trials.jsonl")) == 18
    )


def test_merge_writes_into_no_folder_that_holds_someone_elses_files(tmp_path):
    first, second = make_shards(tmp_path, suite="alpha", records=24)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "summary.csv").write_text("precious\n")
    res = racecheck("merge", first, second, "--out", mine, cwd=tmp_path)
    assert res.code == 2 and res.err.count("\n") == 1 and f"--out {mine} holds files and no racecheck run" in res.err
    (tmp_path / "link").symlink_to(mine)
    res = racecheck("merge", first, second, "--out", tmp_path / "link", cwd=tmp_path)
    assert res.code == 2 and f"(a link to {mine}) holds files and no racecheck run" in res.err, res
    assert sorted(os.listdir(mine)) == ["summary.csv"] and (mine / "summary.csv").read_text() == "precious\n"
