"""The hostile probe's everyday cases: racecheck as the README tells a user to run it, from the
project's root, a subfolder or another folder, with git and env arms, every report format, the
gate's three verdicts, plans, merges of shards from two checkouts, a moved project, resumes,
stops, a console closed under the run, pytest's own options, and a failing trial's replay line.
Each exits 0 (the gate 1 or 4 where it says so) and leaves what the README says it leaves."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import xml.dom.minidom

from hostile_kit import PROJECT, Case, Ctx, Result, command, kept, outcomes, records, write_project

ONE = ("run", "--trials", "1", "-q")
GATE = ("gate", "{done}", "--fixed", "good", "--baseline", "bad")
ENV_TEST = """import os


def test_env(racecheck_arm):
    assert os.environ.get("X") == ("1" if racecheck_arm == "envy" else None)
"""


def _runs(folder) -> list:
    return sorted(folder.iterdir()) if folder.is_dir() else []


def _one_run_in(where: str, *, not_in: str = ""):
    """Then: the run went into exactly one folder under `where` (relative to the case), whole."""

    def then(ctx: Ctx, res: Result) -> str:
        runs = _runs(ctx / where)
        if len(runs) != 1 or not (runs[0] / "summary.csv").is_file():
            return f"{where} holds {[r.name for r in runs]}"
        if not_in and (ctx / not_in / "racecheck-out").exists():
            return f"a racecheck-out in {not_in}"
        return kept(ctx, runs[0])

    return then


def _git(ctx: Ctx, *args: str) -> None:
    ident = ["-c", "user.name=p", "-c", "user.email=p@localhost"]
    subprocess.run(["git", *ident, *args], cwd=ctx.p, check=True, capture_output=True)


def _git_arms(extra: str):
    """The project as a git repository tagged v1, with the README's arm `before` (git = "v1")."""

    def prepare(ctx: Ctx) -> None:
        _git(ctx, "init", "-q")
        _git(ctx, "add", ".")
        _git(ctx, "commit", "-qm", "v1")
        _git(ctx, "tag", "v1")
        with open(ctx.p / "pyproject.toml", "a") as fh:
            fh.write('\n[tool.racecheck.arms.before]\ngit = "v1"\n' + extra)

    return prepare


def _own_tests_only(arms: tuple[str, ...]):
    def then(ctx: Ctx, res: Result) -> str:
        runs = _runs(ctx.p / "racecheck-out") or [ctx.p / "out"]
        got = sorted((r["arm"], r["test"]) for r in records(runs[0]))
        want = sorted((arm, f"test_x.py::{t}") for arm in arms for t in ("test_one", "test_two"))
        return "" if got == want else f"records {got}"

    return then


def _parses(fmt: str):
    def then(ctx: Ctx, res: Result) -> str:
        text = res.out
        if fmt == "json":
            json.loads(text)
        elif fmt == "junit":
            xml.dom.minidom.parseString(text)
        ok = {"csv": text.startswith("scenario,"), "html": "<html" in text.lower(), "markdown": "|" in text}
        return "" if ok.get(fmt, True) else f"{fmt} output: {text[:80]!r}"

    return then


def _merged(ctx: Ctx, res: Result) -> str:
    want = len(records(ctx / "s1")) + len(records(ctx / "s2"))
    got = len(records(ctx / "m"))
    again = ctx.racecheck("report", ctx / "m", "--format", "csv")
    return "" if got == want and again.code == 0 else f"{got} records of {want}; report exit {again.code}"


def _two_checkouts(ctx: Ctx) -> Result:
    first = ctx.racecheck("run", "--trials", "2", "--shard", "1/2", "--out", ctx / "s1", "-q")
    shutil.copytree(ctx.p, ctx / "p2")
    second = ctx.racecheck("run", "--trials", "2", "--shard", "2/2", "--out", ctx / "s2", "-q", cwd=ctx / "p2")
    ctx.note("" if first.code == second.code == 0 else f"shards exit {first.code}, {second.code}")
    return ctx.racecheck("merge", ctx / "s1", ctx / "s2", "--out", ctx / "m")


def _moved(ctx: Ctx) -> Result:
    first = ctx.racecheck("run", "--trials", "1", "--out", ctx.p / "racecheck-out" / "run", "-q")
    ctx.note("" if first.code == 0 else f"first run exit {first.code}")
    shutil.move(ctx.p, ctx / "q")
    res = ctx.racecheck("run", "--resume", ctx / "q" / "racecheck-out" / "run", "--trials", "2", "-q", cwd=ctx.folder)
    shutil.move(ctx / "q", ctx.p)  # and back: kept() resumes it where it lies again
    return res


def _console_closed(ctx: Ctx) -> Result:
    line = " ".join(command(["run", "--trials", "3", "--out", str(ctx / "out")]))
    proc = subprocess.run(
        ["bash", "-c", f"{line} 2>&1 | head -2 >/dev/null; exit ${{PIPESTATUS[0]}}"],
        cwd=ctx.p,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


def _shell(ctx: Ctx, line: str, *, cwd=None) -> Result:
    proc = subprocess.run(["bash", "-c", line], cwd=cwd or ctx.p, capture_output=True, text=True, timeout=300)
    return Result(proc.returncode, proc.stdout, proc.stderr)


def _removed_folder(ctx: Ctx) -> Result:
    """racecheck started in a folder removed under the shell (a checkout rebuilt beside it)."""
    (ctx / "gone").mkdir()
    return _shell(
        ctx, f"cd gone && rmdir ../gone && {shlex.join(command(['run', '--trials', '1', '-q']))}", cwd=ctx.folder
    )


def _closed_output(args: list[str], closes: str):
    def act(ctx: Ctx) -> Result:
        return _shell(ctx, f"{shlex.join(command(ctx.args(args)))} {closes}")

    return act


def _replayed(ctx: Ctx) -> Result:
    """A failing trial's replay line, run as printed, fails the same test in the same arm."""
    first = ctx.racecheck("run", "--trials", "2", "--out", ctx / "out")
    replay = re.search(r"replay: racecheck (run .*)", first.out + first.err)
    if not replay:
        return Result(99, first.out, first.err + "\nno replay line")
    argv = shlex.split(replay.group(1))
    cut = argv.index("--") if "--" in argv else len(argv)
    argv[cut:cut] = ["--out", str(ctx / "replay"), "-q"]  # racecheck's options before pytest's
    res = ctx.racecheck(*argv)
    failed = {(r["arm"], r["test"]) for r in records(ctx / "replay") if r["outcome"] == "failed"}
    ctx.note("" if failed == {("bad", "test_x.py::test_one")} else f"the replay failed {failed}")
    return res


def _stopped_before(limit: int):
    def then(ctx: Ctx, res: Result) -> str:
        trials = {r["trial"] for r in records(ctx / "out")}
        return "" if 0 < len(trials) < limit else f"{len(trials)} trials ran"

    return then


def _only_test_one(ctx: Ctx, res: Result) -> str:
    tests = {t for (_, _, t) in outcomes(ctx / "out")}
    return "" if tests == {"test_one"} else f"tests {tests}"


def _each_once(ctx: Ctx, res: Result) -> str:
    got = records(ctx / "out")
    keys = [(r["arm"], r["trial"], r["test"]) for r in got]
    return "" if len(keys) == len(set(keys)) == 4 else f"{len(keys)} records, {len(set(keys))} distinct"


def _env_project(ctx: Ctx) -> None:
    (ctx.p / "test_x.py").unlink()
    text = PROJECT + '\n[tool.racecheck.arms.envy]\nenv = { X = "1" }\n'
    write_project(ctx.p, pyproject=text, tests={"test_env.py": ENV_TEST})


def _passed_everywhere(ctx: Ctx, res: Result) -> str:
    bad = [k for k, v in outcomes(ctx / "out").items() if v != "passed"]
    return f"not passed: {bad}" if bad else ""


def _summary_appended(ctx: Ctx, res: Result) -> str:
    text = (ctx / "step.md").read_text() if (ctx / "step.md").exists() else ""
    return "" if "tiny" in text else "nothing appended to $GITHUB_STEP_SUMMARY"


def _out_file_kept(ctx: Ctx, res: Result) -> str:
    table = ctx / "done" / "table.md"
    return "" if table.is_file() and table.stat().st_size and kept(ctx, ctx / "done") == "" else "table.md missing"


RUN_OUT = ("run", "--trials", "2", "--out", "{c}/out", "-q")
CASES = [
    Case(
        "everyday use",
        "run with the default --out from the project's root",
        0,
        argv=ONE,
        then=_one_run_in("p/racecheck-out"),
    ),
    Case(
        "everyday use",
        "run from a subfolder of the project",
        0,
        argv=ONE,
        cwd="p/tests",
        prepare=lambda ctx: (ctx.p / "tests").mkdir(),
        then=_one_run_in("p/racecheck-out", not_in="p/tests"),
    ),
    Case(
        "everyday use",
        "run --config from another folder",
        0,
        argv=("run", "--config", "p/pyproject.toml", "--trials", "1", "-q"),
        cwd=".",
        then=_one_run_in("p/racecheck-out", not_in="."),
    ),
    Case(
        "everyday use",
        "run --config with a relative --out from another folder",
        0,
        cwd=".",
        argv=("run", "--config", "p/pyproject.toml", "--trials", "1", "--out", "rel/out", "-q"),
        then=_one_run_in("rel"),
    ),
    Case(
        "everyday use",
        'a git arm (git = "v1") with the default --out',
        0,
        argv=("run", "--arms", "before,good", "--trials", "1", "-q"),
        prepare=_git_arms(""),
        then=_own_tests_only(("before", "good")),
    ),
    Case(
        "everyday use",
        "a git arm beside an env arm, --out inside the project",
        0,
        argv=("run", "--arms", "before,envy", "--trials", "1", "--out", "{p}/out", "-q"),
        prepare=_git_arms('\n[tool.racecheck.arms.envy]\nenv = { X = "1" }\n'),
        then=_own_tests_only(("before", "envy")),
    ),
    Case(
        "everyday use",
        "an env arm whose tests read its variable",
        0,
        argv=("run", "--arms", "good,envy", "--trials", "2", "--out", "{c}/out", "-q"),
        prepare=_env_project,
        then=_passed_everywhere,
    ),
    Case("everyday use", "list", 0, "tiny", argv=("list",)),
    Case("everyday use", "racecheck --version", 0, argv=("--version",)),
    Case("everyday use", "racecheck run --help", 0, "--trials", argv=("run", "--help")),
]
CASES += [
    Case("everyday use", f"report --format {fmt}", 0, argv=("report", "{done}", "--format", fmt), then=_parses(fmt))
    for fmt in ("terminal", "markdown", "csv", "json", "junit", "html")
]
CASES += [
    Case(
        "everyday use",
        "report -o a new file in the run folder",
        0,
        argv=("report", "{done}", "--format", "markdown", "-o", "{done}/table.md"),
        then=_out_file_kept,
    ),
    Case(
        "everyday use",
        "report --github-summary",
        0,
        argv=("report", "{done}", "--github-summary"),
        env={"GITHUB_STEP_SUMMARY": "{c}/step.md"},
        then=_summary_appended,
    ),
    Case("everyday use", "a gate that passes", 0, "PASS", argv=GATE),
    Case(
        "everyday use",
        "a gate that fails",
        1,
        "FAIL",
        argv=("gate", "{done}", "--fixed", "bad", "--baseline", "good"),
    ),
    Case(
        "everyday use",
        "a gate too few trials decide",
        4,
        "UNDECIDED",
        argv=(*GATE, "--confidence", "0.95", "--max-rate", "0.1"),
    ),
    Case(
        "everyday use",
        "run --gate that passes",
        0,
        "PASS",
        argv=(*RUN_OUT, "--gate", "--fixed", "good", "--baseline", "bad"),
    ),
    Case("everyday use", "plan --bound 0.05", 0, argv=("plan", "--bound", "0.05")),
    Case("everyday use", "plan --baseline-rate 0.5", 0, argv=("plan", "--baseline-rate", "0.5")),
    Case("everyday use", "merge two shards", 0, argv=("merge", "{s1}", "{s2}", "--out", "{c}/m"), then=_merged),
    Case("everyday use", "merge shards run in two checkouts", 0, act=_two_checkouts, then=_merged),
    Case("everyday use", "--resume a moved project", 0, act=_moved, keeps="p/racecheck-out/run"),
    Case(
        "everyday use",
        "--resume to extend a finished run",
        0,
        argv=("run", "--resume", "{done}", "--trials", "5", "-q"),
        keeps="done",
    ),
    Case(
        "everyday use",
        "--shard 2/5 of one trial (an empty slice)",
        0,
        "nothing to run",
        argv=("run", "--trials", "1", "--shard", "2/5", "--out", "{c}/out"),
    ),
    Case(
        "everyday use",
        "--stop-when bad:failures>=1",
        0,
        argv=("run", "--trials", "50", "--stop-when", "bad:failures>=1", "--out", "{c}/out", "-q"),
        then=_stopped_before(50),
    ),
    Case(
        "everyday use",
        "--max-time 1 on a million trials",
        0,
        argv=("run", "--trials", "1000000", "--max-time", "1", "--out", "{c}/out", "-q"),
        then=_stopped_before(1000000),
    ),
    Case("everyday use", "--isolation process", 0, argv=(*RUN_OUT, "--isolation", "process"), keeps="out"),
    Case("everyday use", "--order random", 0, argv=(*RUN_OUT, "--order", "random"), keeps="out"),
    Case("everyday use", "--no-perturb", 0, argv=(*RUN_OUT, "--no-perturb"), keeps="out"),
    Case("everyday use", "pytest's --maxfail=1 after --", 0, argv=(*RUN_OUT, "--", "--maxfail=1"), keeps="out"),
    Case("everyday use", "pytest's -k after --", 0, argv=(*RUN_OUT, "--", "-k", "test_one"), then=_only_test_one),
    Case(
        "everyday use",
        "pytest-xdist after -- (-p xdist -n 2)",
        0,
        argv=(*RUN_OUT, "--arms", "good", "--", "-p", "xdist", "-n", "2"),
        then=_each_once,
    ),
    Case("everyday use", "a console closed under the run (| head -2)", 0, act=_console_closed, keeps="out"),
    Case(
        "everyday use",
        "run with its standard output closed (>&-)",
        0,
        act=_closed_output(list(RUN_OUT), ">&-"),
        keeps="out",
    ),
    Case(
        "everyday use",
        "list with standard output and error closed (>&- 2>&-)",
        0,
        act=_closed_output(["list"], ">&- 2>&-"),
    ),
    Case("everyday use", "run in a current folder removed under the shell", 2, "current folder", act=_removed_folder),
    Case("everyday use", "a failing trial's replay line, run as printed", 0, act=_replayed),
    Case(
        "everyday use",
        "the main job from an empty folder (the catalogue, 1 trial)",
        0,
        "baseline 1/1 failed",
        argv=("run", "--arms", "fixed,baseline", "--trials", "1", "--out", "{c}/main"),
        cwd="empty",
        prepare=lambda ctx: (ctx / "empty").mkdir(),
    ),
]


def cases() -> list[Case]:
    return CASES
