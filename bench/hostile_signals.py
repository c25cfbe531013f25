"""The hostile probe's cases of signals and of two racecheck processes at once.

Signals reach a run where its suite says: the suite's middle test, in trial 0 only, writes a mark
and waits; the probe sends the signal once the mark is there (SIGINT, SIGTERM, two SIGTERMs,
SIGKILL, SIGSTOP and SIGCONT), so the case is the same on a loaded machine and an idle one. A
signal late in a run or a merge is sent from inside it when it reaches a system call
(tests/signal_at.py: while it writes summary.csv, while a merge stages or renames its files).
Each ends with 130 and its one line (SIGKILL: killed, with nothing of its sessions left) and
keeps every finished trial.

Concurrency: two runs, merges or resumes on one folder (one wins, the other is refused with 2 or
3 and writes nothing), two runs with the default --out started together (both run, in folders
of their own), and report, merge and --resume on a folder a run holds."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
from hostile_kit import ROOT, Case, Ctx, Result, command, kept, last_line, records, write_project

WAIT = """
import os
import time


def test_a_ok():
    pass


def test_b_waits():
    mark = os.environ.get("HOSTILE_MARK")
    if mark and not os.path.exists(mark):
        open(mark, "w").close()
        go = time.monotonic() + 120
        while not os.path.exists(mark + ".go") and time.monotonic() < go:
            time.sleep(0.05)  # the probe signals the runner meanwhile, and may let the test go on


def test_c_ok():
    pass
"""
PATIENCE = 120.0  # seconds the probe waits for a mark or a process; the cases take a few


def _start(ctx: Ctx, args: list[str], cwd: Path | None = None, *, via: list[str] | None = None) -> subprocess.Popen:
    env = {**os.environ, "HOSTILE_MARK": str(ctx / "mark")}
    argv = [*via, "--", *args] if via else command(args)
    return subprocess.Popen(
        argv, cwd=cwd or ctx.p, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace"
    )


def _finish(proc: subprocess.Popen) -> Result:
    out, err = proc.communicate(timeout=PATIENCE)
    return Result(proc.returncode, out, err)


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + PATIENCE
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.05)


def _waiting_suite(ctx: Ctx) -> None:
    write_project(ctx.p, tests={"test_x.py": WAIT})


def _signal_mid_trial(*signals: signal.Signals, args: tuple = ("run", "--trials", "3", "--out", "{c}/out", "-q")):
    """The signals, in turn, to the runner while trial 0's middle test waits."""

    def act(ctx: Ctx) -> Result:
        _waiting_suite(ctx)
        proc = _start(ctx, ctx.args(args))
        _wait_for(ctx / "mark")
        for sig in signals:
            proc.send_signal(sig)
        (ctx / "mark.go").touch()
        return _finish(proc)

    return act


def _resume_interrupted(ctx: Ctx) -> Result:
    """SIGINT to a --resume while its first new trial's middle test waits."""
    _waiting_suite(ctx)
    first = ctx.racecheck("run", "--trials", "1", "--out", ctx / "out", "-q")
    (ctx / "mark").unlink(missing_ok=True)
    if first.code != 0:
        return first
    proc = _start(ctx, ["run", "--resume", str(ctx / "out"), "--trials", "3", "-q"])
    _wait_for(ctx / "mark")
    proc.send_signal(signal.SIGINT)
    return _finish(proc)


def _signal_at(target: list[str], args: tuple, *, prepare_out: bool = False):
    """SIGTERM from inside racecheck ARGS when it reaches `target` (tests/signal_at.py)."""

    def act(ctx: Ctx) -> Result:
        via = [sys.executable, str(ROOT / "tests" / "signal_at.py"), *target]
        return _finish(_start(ctx, ctx.args(args), via=via))

    return act


def _summary_whole(ctx: Ctx, res: Result) -> str:
    text = (ctx / "out" / "summary.csv").read_text() if (ctx / "out" / "summary.csv").is_file() else ""
    return "" if text.startswith("scenario,") and text.endswith("\n") else "summary.csv not whole"


def _merge_unchanged(ctx: Ctx, res: Result) -> str:
    left = sorted(p.name for p in (ctx / "m").iterdir()) if (ctx / "m").exists() else []
    return "" if not {"trials.jsonl", "run.json"} & set(left) else f"the interrupted merge left {left}"


def _merge_whole(ctx: Ctx, res: Result) -> str:
    want = len(records(ctx / "s1")) + len(records(ctx / "s2"))
    return "" if len(records(ctx / "m")) == want else f"{len(records(ctx / 'm'))} records of {want}"


def _ours(ctx: Ctx) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cwd"]):
        if (proc.info.get("cwd") or "").startswith(f"{ctx.folder}/") and proc.pid != os.getpid():
            found.append(proc)
    return found


def _killed(ctx: Ctx) -> Result:
    """SIGKILL to the runner mid-trial: its session dies with it, before anything resumes the run."""
    res = _signal_mid_trial(signal.SIGKILL)(ctx)
    deadline = time.monotonic() + 10.0  # the session's watchdog sees the runner gone within a second
    while (left := _ours(ctx)) and time.monotonic() < deadline:
        time.sleep(0.1)
    ctx.note(f"{len(left)} process(es) of the killed run's session still running" if left else "")
    return res


TERM, INT = signal.SIGTERM, signal.SIGINT
SIGNAL_CASES = [
    Case("signals", "SIGINT during a trial", 130, "interrupted", act=_signal_mid_trial(INT), keeps="out"),
    Case("signals", "SIGTERM during a trial", 130, "interrupted", act=_signal_mid_trial(TERM), keeps="out"),
    Case("signals", "two SIGTERMs during a trial", 130, "interrupted", act=_signal_mid_trial(TERM, TERM), keeps="out"),
    Case(
        "signals",
        "SIGINT then SIGTERM during a trial",
        130,
        "interrupted",
        act=_signal_mid_trial(INT, TERM),
        keeps="out",
    ),
    Case("signals", "SIGKILL during a trial", -9, act=_killed, keeps="out"),
    Case(
        "signals",
        "SIGSTOP and SIGCONT during a trial",
        0,
        act=_signal_mid_trial(signal.SIGSTOP, signal.SIGCONT),
        keeps="out",
    ),
    Case(
        "signals",
        "SIGINT during a trial of a run folder named with a line break",
        130,
        "interrupted",
        act=_signal_mid_trial(INT, args=("run", "--trials", "3", "--out", "{c}/new\nline", "-q")),
        keeps="new\nline",
    ),
    Case("signals", "SIGINT during a --resume", 130, "interrupted", act=_resume_interrupted, keeps="out"),
    Case(
        "signals",
        "SIGTERM while the run writes summary.csv",
        130,
        "interrupted",
        act=_signal_at(["os.replace", "before", "summary.csv"], ("run", "--trials", "2", "--out", "{c}/out", "-q")),
        then=_summary_whole,
        keeps="out",
    ),
    Case(
        "signals",
        "SIGTERM while a merge stages its files",
        130,
        "unchanged",
        act=_signal_at(["os.fsync", "after"], ("merge", "{s1}", "{s2}", "--out", "{c}/m")),
        then=_merge_unchanged,
    ),
    Case(
        "signals",
        "SIGTERM between a merge's renames",
        130,
        "whole merge",
        act=_signal_at(["os.replace", "before", "run.json"], ("merge", "{s1}", "{s2}", "--out", "{c}/m")),
        then=_merge_whole,
    ),
]


# -- two processes at once ---------------------------------------------------------------------------
def _two(args_a: tuple, args_b: tuple, *, hold: bool = True):
    """Two racecheck commands started together; the result is the loser's (or the second's)."""

    def act(ctx: Ctx) -> Result:
        if hold:
            _waiting_suite(ctx)
            (ctx / "mark").touch()  # nobody waits: the two only overlap
        procs = [_start(ctx, ctx.args(a)) for a in (args_a, args_b)]
        results = [_finish(p) for p in procs]
        codes = sorted(r.code for r in results)
        ctx.note("" if codes[0] == 0 else f"exits {codes}: no command won")
        return max(results, key=lambda r: r.code)

    return act


def _while_running(args: tuple, *, then_code: int | None = None):
    """racecheck ARGS while a run on {c}/out waits in trial 0; the result is that command's."""

    def act(ctx: Ctx) -> Result:
        _waiting_suite(ctx)
        run = _start(ctx, ["run", "--trials", "2", "--out", str(ctx / "out"), "-q"])
        try:
            _wait_for(ctx / "mark")
            res = ctx.racecheck(*args, process=True)
        finally:
            run.send_signal(signal.SIGINT)
            ended = _finish(run)
        ctx.note("" if ended.code == 130 else f"the run ended {ended.code}: {last_line(ended.err)}")
        return res

    return act


def _one_log(ctx: Ctx, res: Result) -> str:
    lines = (ctx / "out" / "trials.jsonl").read_text().splitlines()
    runs = {json.loads(line)["run_id"] for line in lines}
    return "" if len(runs) == 1 and len(lines) == 6 else f"{len(lines)} records of {len(runs)} runs"


def _two_folders(ctx: Ctx, res: Result) -> str:
    runs = sorted((ctx.p / "racecheck-out").iterdir())
    lost = [kept(ctx, run) for run in runs]
    return "" if len(runs) == 2 and not any(lost) else f"run folders {[r.name for r in runs]}: {lost}"


RUN = ("run", "--trials", "1", "--out", "{c}/out", "-q")
RESUME = ("run", "--resume", "{done}", "--trials", "4", "-q")
MERGE = ("merge", "{s1}", "{s2}", "--out", "{c}/m")
DEFAULT = ("run", "--trials", "1", "-q")
CONCURRENCY_CASES = [
    Case(
        "concurrency",
        "two runs started together on one --out",
        (3, 2),
        "in use|holds",
        act=_two(RUN, RUN),
        then=_one_log,
    ),
    Case(
        "concurrency",
        "two merges started together into one --out",
        (3, 2),
        "in use|holds",
        act=_two(MERGE, MERGE),
        then=_merge_whole,
    ),
    Case(
        "concurrency",
        "two resumes started together of one folder",
        (3, 0),
        "in use",
        act=_two(RESUME, RESUME, hold=False),
        keeps="done",
    ),
    Case(
        "concurrency",
        "two runs with the default --out started together",
        0,
        act=_two(DEFAULT, DEFAULT),
        then=_two_folders,
    ),
    Case("concurrency", "report of a folder a run holds", 0, act=_while_running(("report", "{c}/out"))),
    Case(
        "concurrency",
        "--resume of a folder a run holds",
        3,
        "in use",
        act=_while_running(("run", "--resume", "{c}/out", "-q")),
        keeps="out",
    ),
    Case(
        "concurrency",
        "merge into a folder a run holds",
        3,
        "in use|holds",
        act=_while_running(("merge", "{s1}", "{s2}", "--out", "{c}/out")),
        keeps="out",
    ),
    Case(
        "concurrency",
        "a second run on a folder a run holds",
        3,
        "in use|holds",
        act=_while_running(("run", "--trials", "1", "--out", "{c}/out", "-q")),
        keeps="out",
    ),
]


def cases() -> list[Case]:
    return SIGNAL_CASES + CONCURRENCY_CASES
