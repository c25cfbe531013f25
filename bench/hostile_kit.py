"""What the hostile probe's cases share (bench/hostile_inputs.py runs them).

A case is data: what it does (racecheck's arguments, or a function for what arguments alone
cannot do: a signal, two commands at once, a disk that fills), the exit code the README gives
for it, and what its line must say. Each case runs in a folder of its own under the probe's
temporary folder, with a copy of a small project (`p/`) and a folder of someone else's files
(`foreign/`), and gets the same checks:
- its exit code;
- no traceback anywhere, nor click's usage block; for a refusal (exit 2, 3 or 130) the last line
  of stderr is racecheck's one line (`racecheck: ...`), and it says why (`says`, a regex);
- nothing in `foreign/`, in the probe's `witness/` folder, or beside the case's folder touched;
- where the case names a run folder (`keeps`), no finished trial lost: every record of a trial
  that completed.jsonl held after the case is still in trials.jsonl after `racecheck run
  --resume`, no line of the log is torn, and the resume finishes every planned trial.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROJECT = (
    '[tool.racecheck]\nname = "tiny"\n\n'
    '[tool.racecheck.arms.good]\nexpect = "safe"\n\n[tool.racecheck.arms.bad]\nexpect = "race"\n'
)
TESTS = """\
def test_one(racecheck_arm):
    assert racecheck_arm != "bad", "the bad arm fails"


def test_two():
    pass
"""
FOREIGN = {"notes.txt": "someone else's notes\n", "summary.csv": "precious\n", "trials.jsonl": '{"mine": 1}\n'}
TRIALS = 3  # trials per arm of the finished run that cases copy ({done}, and the shards {s1}, {s2})
FIXTURES = ("done", "s1", "s2")
REFUSALS = (2, 3, 130)


@dataclass
class Result:
    code: int
    out: str
    err: str


@dataclass(frozen=True)
class Case:
    """One hostile input. `argv`: racecheck's arguments, with {p} (the project), {c} (the case's
    folder), {done}, {s1}, {s2} (copies of a finished run and of its two shards) and {foreign};
    `act` instead, for what arguments cannot say, returns the result the exit code and the line
    are read from; `then` checks more and returns what failed ('' when all held)."""

    kind: str
    name: str
    expect: int | tuple[int, ...]  # a tuple where either is right: which of two commands wins
    says: str = ""
    argv: tuple = ()
    cwd: str = "p"
    env: dict = field(default_factory=dict)
    prepare: Callable[[Ctx], None] | None = None
    act: Callable[[Ctx], Result] | None = None
    keeps: str = ""
    then: Callable[[Ctx, Result], str] | None = None
    process: bool = False  # racecheck as a process of its own, not in the probe's process


class Ctx:
    """A case's folder: `p` the project, `foreign` someone else's files, and the fixtures."""

    def __init__(self, folder: Path, fixtures: Path) -> None:
        self.folder, self.fixtures = folder, fixtures
        self.p = folder / "p"
        self.foreign = folder / "foreign"
        self.noted: list[str] = []  # what an `act` found wrong beside its result

    def note(self, problem: str) -> None:
        if problem:
            self.noted.append(problem)

    def __truediv__(self, name: str) -> Path:
        return self.folder / name

    def fixture(self, name: str) -> Path:
        target = self.folder / name
        if not target.exists():
            shutil.copytree(self.fixtures / name, target, symlinks=True)
        return target

    def args(self, argv) -> list[str]:
        text = [str(a) for a in argv]
        for name in FIXTURES:
            if any("{" + name + "}" in a for a in text):
                self.fixture(name)
        places = {"p": self.p, "c": self.folder, "foreign": self.foreign, **{n: self.folder / n for n in FIXTURES}}
        return [a.format(**places) if "{" in a else a for a in text]

    def racecheck(self, *argv, cwd: Path | None = None, env: dict | None = None, process: bool = False, **kw) -> Result:
        run = as_process if process else in_process
        values = dict(zip(env or {}, self.args((env or {}).values()), strict=True))
        env = {k: None if (env or {})[k] is None else v for k, v in values.items()}
        return run(self.args(argv), cwd=cwd or self.p, env=env, **kw)


@contextlib.contextmanager
def environment(cwd: Path, env: dict):
    """`cwd` and `env` (a value None unsets the variable) for the time of one command."""
    old_cwd, old_env = os.getcwd(), dict(os.environ)
    os.chdir(cwd)
    for key, value in env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = str(value)
    try:
        yield
    finally:
        os.chdir(old_cwd)
        os.environ.clear()
        os.environ.update(old_env)


def in_process(args: list[str], *, cwd: Path, env: dict) -> Result:
    """`racecheck ARGS` through its console entry point in this process, its exit-code policy
    included; an exception that escapes it is what a console would show: a traceback, exit 1."""
    from racecheck.cli import main

    out, err = io.StringIO(), io.StringIO()
    argv, code = sys.argv, 0
    sys.argv = ["racecheck", *args]
    try:
        with environment(cwd, env), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - a console would print it and exit 1
        code = 1
        err.write(traceback.format_exc())
    finally:
        sys.argv = argv
    return Result(code, out.getvalue(), err.getvalue())


def command(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "racecheck", *args]


def as_process(args: list[str], *, cwd: Path, env: dict, timeout: float = 300, **popen) -> Result:
    full = {k: v for k, v in {**os.environ, **env}.items() if v is not None}
    proc = subprocess.run(
        command(args), cwd=cwd, env=full, capture_output=True, text=True, errors="replace", timeout=timeout, **popen
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


def last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def expected(case: Case) -> str:
    return " or ".join(map(str, case.expect)) if isinstance(case.expect, tuple) else str(case.expect)


def problems(case: Case, res: Result) -> list[str]:
    """What the case's result breaks of its promise: the code, one line, no traceback."""
    found = []
    both = res.out + res.err
    codes = case.expect if isinstance(case.expect, tuple) else (case.expect,)
    if res.code not in codes:
        found.append(f"exit {res.code}, not {expected(case)}")
    if "Traceback (most recent call last)" in both:
        found.append("a traceback")
    if re.search(r"^(Usage|Error): ", res.err, re.M):
        found.append("click's usage block")
    said = both
    if res.code in REFUSALS and res.code in codes:
        said = last_line(res.err)
        if not said.startswith("racecheck: "):
            found.append(f"its last line is not racecheck's: {said[:120]!r}")
    if case.says and not re.search(case.says, said):
        found.append(f"does not say /{case.says}/")
    return found


def snapshot(*folders: Path) -> dict[str, tuple]:
    """Every entry under `folders`: its kind and content (a link's target, a file's hash)."""
    seen: dict[str, tuple] = {}
    for folder in folders:
        for path in sorted([folder, *folder.rglob("*")]) if folder.exists() else []:
            if path.is_symlink():
                seen[str(path)] = ("link", os.readlink(path))
            elif path.is_file():
                seen[str(path)] = ("file", hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mode)
            else:
                seen[str(path)] = ("folder", path.stat().st_mode)
    return seen


def finished_records(folder: Path) -> tuple[list[str], int]:
    """The lines of trials.jsonl that belong to a trial completed.jsonl says finished, and the
    number of lines that are not whole JSON objects (a torn line)."""
    log, done = folder / "trials.jsonl", folder / "completed.jsonl"
    lines = log.read_text(errors="replace").splitlines() if log.is_file() else []
    records, torn = [], 0
    for line in lines:
        try:
            records.append((line, json.loads(line)))
        except ValueError:
            torn += 1
    blocks = set()
    for line in done.read_text().splitlines() if done.is_file() else []:
        block = json.loads(line)
        blocks.add((block["scenario"], block["arm"], block["trial"]))
    return [line for line, r in records if (r.get("scenario"), r.get("arm"), r.get("trial")) in blocks], torn


def kept(ctx: Ctx, folder: Path) -> str:
    """'' when no finished trial of the run in `folder` was lost and --resume finishes the run."""
    before, torn = finished_records(folder)
    if torn:
        return f"{torn} torn line(s) in trials.jsonl"
    res = in_process(["run", "--resume", str(folder), "-q"], cwd=ctx.p, env={})
    if res.code != 0:
        return f"--resume exit {res.code}: {last_line(res.err)[:150]}"
    after = set((folder / "trials.jsonl").read_text().splitlines())
    lost = [line for line in before if line not in after]
    if lost:
        return f"{len(lost)} record(s) of finished trials lost"
    planned = json.loads((folder / "run.json").read_text())["trials"]
    with open(folder / "summary.csv", newline="") as fh:
        short = [r["arm"] for r in csv.DictReader(fh) if r["test"] == "*" and int(r["trials"]) != planned]
    return f"arms {short} short of {planned} trials after --resume" if short else ""


def records(folder: Path) -> list[dict]:
    """The trial records of a run folder (lines that are not JSON left out)."""
    found = []
    log = folder / "trials.jsonl"
    for line in log.read_text(errors="replace").splitlines() if log.is_file() else []:
        with contextlib.suppress(ValueError):
            found.append(json.loads(line))
    return found


def outcomes(folder: Path) -> dict[tuple[str, int, str], str]:
    """{(arm, trial, test name): outcome} of a run folder's records."""
    return {(r["arm"], r["trial"], r["test"].rsplit("::", 1)[-1]): r["outcome"] for r in records(folder)}


def write_project(root: Path, *, pyproject: str = PROJECT, tests: dict | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "pyproject.toml").write_text(pyproject)
    for name, text in (tests if tests is not None else {"test_x.py": TESTS}).items():
        (root / name).write_text(text)
    return root


def make_fixtures(fixtures: Path) -> None:
    """The project, a finished run of it (`done`) and the two shards of another (`s1`, `s2`)."""
    project = write_project(fixtures / "p")
    runs = {"done": [], "s1": ["--shard", "1/2"], "s2": ["--shard", "2/2"]}
    for name, extra in runs.items():
        res = in_process(
            ["run", "--trials", str(TRIALS), "--out", str(fixtures / name), "-q", *extra], cwd=project, env={}
        )
        if res.code != 0:
            raise SystemExit(f"the probe's fixture run {name} failed: {res}")
