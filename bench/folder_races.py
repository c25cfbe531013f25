"""Two racecheck processes on one run folder, many times over: two merges of different shard sets
into one `--out`, and two runs started together on one `--out`. Prints one line per try and the
tally, and writes the tally to reports/folder_races.md.

A merge try is correct when one merge exits 0, the other exits 3 (the folder is in use) or 2 (it
already holds a run), and the folder holds the winner's merge whole: each of its records once
(`--records` lines), all of one suite, under the run.json of the winner's inputs. The two sets
are two splits (1/2, 2/2) of runs of different suites, `alpha` and `beta`, so that a log that
mixes them shows. A run try is correct when one run exits 0, the other 3 or 2, and the log holds
the winner's one record.

    .venv/bin/python bench/folder_races.py [--tries 20] [--records 12000] [--racecheck .venv/bin/racecheck]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from racecheck.runner.trial_log import TrialRecord  # noqa: E402

ARMS = ("a", "b")
TESTS = ("test_x.py::test_one[1]", "test_x.py::test_one[2]", "test_x.py::test_two")


def run_json(*, suite: str, trials: int, shard: str) -> dict:
    """A shard's run.json as `racecheck run --shard` writes it, for a project suite `suite`."""
    return {
        "source": {"kind": "config", "path": f"/nowhere/{suite}/pyproject.toml"},
        "arms": None,
        "trials": trials,
        "perturb": None,
        "seed": 0,
        "isolation": "session",
        "order": "alternate",
        "chunk": 5,
        "timeout": 300.0,
        "backend": "auto",
        "detect": False,
        "pytest_args": [],
        "all_arms": False,
        "world_size": None,
        "mesh": None,
        "shard": shard,
        "shard_source": "",
        "revisions": {},
        "worlds": {suite: 1},
        "skipped": {},
        "scenarios": {suite: {"arms": list(ARMS), "perturb": {a: "off" for a in ARMS}}},
        "attempts": [{"run_id": f"{suite}-{shard[0]}", "started": "2026-01-01T00:00:00+00:00", "trials": trials}],
        "run_id": f"{suite}-{shard[0]}",
    }


def make_shards(folder: Path, *, suite: str, records: int) -> list[Path]:
    """Shards 1/2 and 2/2 of a finished run of `suite` holding `records` records between them
    (whole trials: len(ARMS) x len(TESTS) records each); returns their folders."""
    per_trial = len(ARMS) * len(TESTS)
    trials = max(2, records // per_trial)
    shards = []
    for index in (1, 2):
        shard = folder / f"{suite}-shard-{index}"
        shard.mkdir(parents=True)
        first, last = (index - 1) * trials // 2, index * trials // 2
        (shard / "run.json").write_text(json.dumps(run_json(suite=suite, trials=trials, shard=f"{index}/2")))
        lines, done = [], []
        for trial in range(first, last):
            for arm in ARMS:
                for test in TESTS:
                    outcome = "failed" if arm == "a" and trial % 3 == 0 else "passed"
                    params = test[test.index("[") + 1 : -1] if test.endswith("]") else ""
                    record = TrialRecord(f"{suite}-{index}", suite, arm, "", trial, trial, test, params, outcome)
                    lines.append(record.to_json() + "\n")
                done.append(json.dumps({"scenario": suite, "arm": arm, "trial": trial, "outcome": "passed"}) + "\n")
        (shard / "trials.jsonl").write_text("".join(lines))
        (shard / "completed.jsonl").write_text("".join(done))
        shards.append(shard)
    return shards


def _start(command: list[str], cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    return subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(procs: list[subprocess.Popen]) -> list[tuple[int, list[str]]]:
    """Each process's exit code and the last line of its stderr (as a list: none when empty)."""
    ends = []
    for p in procs:
        _, err = p.communicate(timeout=300)
        ends.append((p.returncode, err.strip().splitlines()[-1:]))
    return ends


def merge_try(racecheck: str, work: Path, sets: dict[str, list[Path]], records: int) -> tuple[bool, str]:
    out = work / "merged"
    procs = [_start([racecheck, "merge", *map(str, shards), "--out", str(out)], work) for shards in sets.values()]
    ends = _finish(procs)
    codes = [code for code, _ in ends]
    lines = (out / "trials.jsonl").read_text().splitlines() if (out / "trials.jsonl").exists() else []
    suites = {json.loads(line)["scenario"] for line in lines}
    run = json.loads((out / "run.json").read_text()) if (out / "run.json").exists() else {}
    winner = [name for name, code in zip(sets, codes, strict=True) if code == 0]
    ok = (
        sorted(codes) in ([0, 2], [0, 3])
        and len(lines) == records
        and suites == set(winner)
        and run.get("merged_from") == [str(p) for p in sets[winner[0]]]
    )
    return ok, f"exits {codes}, {len(lines)} lines, suites {sorted(suites)}, " + "; ".join(
        msg[0] for _, msg in ends if msg
    )


HOLD = "import time\n\ndef test_hold():\n    time.sleep(1.0)\n"


def run_try(racecheck: str, project: Path, out: Path) -> tuple[bool, str]:
    procs = [_start([racecheck, "run", "--trials", "1", "-q", "--out", str(out)], project) for _ in range(2)]
    ends = _finish(procs)
    codes = [code for code, _ in ends]
    log = out / "trials.jsonl"
    outcomes = [json.loads(line)["outcome"] for line in log.read_text().splitlines()] if log.exists() else []
    ok = sorted(codes) in ([0, 2], [0, 3]) and outcomes == ["passed"]
    loser = "; ".join(msg[0] for code, msg in ends if code != 0 and msg)
    return ok, f"exits {codes}, records {outcomes}, {loser}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tries", type=int, default=20)
    parser.add_argument("--records", type=int, default=12000)
    parser.add_argument("--racecheck", default=str(ROOT / ".venv" / "bin" / "racecheck"))
    parser.add_argument("--report", type=lambda v: Path(v) if v else None, default=ROOT / "reports" / "folder_races.md")
    args = parser.parse_args()
    started = time.monotonic()
    tally = {"merge": 0, "run": 0}
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        sets = {suite: make_shards(base / "shards", suite=suite, records=args.records) for suite in ("alpha", "beta")}
        records = sum(len((s / "trials.jsonl").read_text().splitlines()) for s in sets["alpha"])
        for t in range(args.tries):
            work = base / f"merge-{t}"
            work.mkdir()
            ok, what = merge_try(args.racecheck, work, sets, records)
            tally["merge"] += ok
            print(f"merge try {t + 1}: {'correct' if ok else 'WRONG'}: {what}", flush=True)
        project = base / "project"
        project.mkdir()
        (project / "pyproject.toml").write_text('[tool.racecheck]\nname = "hold"\n\n[tool.racecheck.arms.only]\n')
        (project / "test_hold.py").write_text(HOLD)
        for t in range(args.tries):
            ok, what = run_try(args.racecheck, project, base / f"run-{t}")
            tally["run"] += ok
            print(f"run try {t + 1}: {'correct' if ok else 'WRONG'}: {what}", flush=True)
    summary = textwrap.dedent(
        f"""\
        # Two racecheck processes on one run folder

        `{" ".join(["python", "bench/folder_races.py", "--tries", str(args.tries), "--records", str(args.records)])}`
        ({time.monotonic() - started:.0f} s; one line per try in `reports/folder_races.log`)

        | race | correct |
        | --- | --- |
        | two merges of different shard sets ({records} records each) into one `--out` | {tally["merge"]}/{args.tries} |
        | two runs started together on one `--out` | {tally["run"]}/{args.tries} |
        """
    )
    print(summary, end="")
    if args.report:
        args.report.write_text(summary, encoding="utf-8")


if __name__ == "__main__":
    main()
