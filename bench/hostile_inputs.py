"""The hostile probe: racecheck as a careless or a hostile user meets it, case by case, on the CPU.

Bad options and configs, spoiled run folders, faulty suites, disks that fill or refuse writes,
signals, two commands on one folder, and everyday ways of running it. Each case is data (the
`cases()` of hostile_options.py, hostile_configs.py, hostile_folders.py, hostile_faults.py,
hostile_disks.py, hostile_signals.py and hostile_everyday.py) that states the exit code the README
gives for it and what its one line says, and runs in a temporary folder of its own;
hostile_kit.py says what every case is checked for. Rendezvous endpoints are loopback addresses
only. Prints one line per case, writes the same lines to the log, and the totals per kind to the
report. The disk cases mount a tmpfs and use chattr: run it as root.

    .venv/bin/python bench/hostile_inputs.py [--report reports/hostile_inputs.md]
        [--log reports/hostile_inputs.log] [--only REGEX]
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import hostile_configs  # noqa: E402
import hostile_disks  # noqa: E402
import hostile_everyday  # noqa: E402
import hostile_faults  # noqa: E402
import hostile_folders  # noqa: E402
import hostile_options  # noqa: E402
import hostile_signals  # noqa: E402
import psutil  # noqa: E402
from hostile_kit import (  # noqa: E402
    FOREIGN,
    ROOT,
    Case,
    Ctx,
    expected,
    kept,
    last_line,
    make_fixtures,
    problems,
    snapshot,
    write_project,
)

KINDS = ("options", "configs", "run folders", "faulty suites", "disks", "signals", "concurrency", "everyday use")
MODULES = (
    hostile_options,
    hostile_configs,
    hostile_folders,
    hostile_faults,
    hostile_disks,
    hostile_signals,
    hostile_everyday,
)


def left_running(folder: Path) -> list[psutil.Process]:
    """Processes whose working folder lies in `folder`: what a case left behind."""
    found = []
    for proc in psutil.process_iter(["cwd"]):
        cwd = proc.info.get("cwd") or ""
        if proc.pid != os.getpid() and (cwd == str(folder) or cwd.startswith(f"{folder}/")):
            found.append(proc)
    return found


def run_case(case: Case, folder: Path, fixtures: Path, witness: Path) -> tuple[list[str], str]:
    """What failed of the case's promises ([] when every one held), and what racecheck said: its
    exit code and the last line of its stderr (else of its output)."""
    ctx = Ctx(folder, fixtures)
    write_project(ctx.p)
    ctx.foreign.mkdir()
    for name, text in FOREIGN.items():
        (ctx.foreign / name).write_text(text)
    if case.prepare:
        case.prepare(ctx)
    watched = (ctx.foreign, witness)
    before, beside = snapshot(*watched), sorted(os.listdir(folder.parent))
    said = "no result"
    try:
        if case.act:
            res = case.act(ctx)
        else:
            res = ctx.racecheck(*case.argv, cwd=folder / case.cwd, env=case.env, process=case.process)
        found = problems(case, res)
        said = f"exit {res.code}: {(last_line(res.err) or last_line(res.out))[:160]}"
        if case.then and (more := case.then(ctx, res)):
            found.append(more)
        if case.keeps and (lost := kept(ctx, folder / case.keeps)):
            found.append(lost)
        found += ctx.noted
    except Exception as exc:  # noqa: BLE001 - the probe says which case it could not carry out
        found = [f"the probe could not carry the case out: {exc!r}"]
    if snapshot(*watched) != before:
        found.append("someone else's files touched")
    if sorted(os.listdir(folder.parent)) != beside:
        found.append("wrote beside its folder")
    if stray := left_running(folder):
        found.append(f"left {len(stray)} process(es) running")
        for proc in stray:
            proc.kill()
    return found, said


def working_tree() -> str:
    return subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout


def report(tally: dict, seconds: float, revision: str, failed: list[str], tree: str) -> str:
    rows = "\n".join(f"| {kind} | {tally[kind][0]} | {tally[kind][1]} |" for kind in KINDS)
    held, count = sum(t[1] for t in tally.values()), sum(t[0] for t in tally.values())
    return (
        "# The hostile probe: bad input, faults and everyday use\n\n"
        f"`python bench/hostile_inputs.py` at {revision}, {datetime.date.today()}, on the CPU "
        f"({seconds:.0f} s; one line per case in `reports/hostile_inputs.log`).\n\n"
        "Each case runs in a temporary folder of its own and states the exit code the README gives for "
        "it; it holds when racecheck exits with that code, without a traceback, a refusal (2, 3, 130) in "
        "one last line that says why, nothing outside its folder or in its folder of someone else's "
        "files touched, no process left running, and, where the case names a run folder, no finished "
        "trial lost (`racecheck run --resume` then finishes the run with every record it held).\n\n"
        "| kind | cases | held |\n| --- | ---: | ---: |\n"
        f"{rows}\n| all | {count} | {held} |\n\n"
        f"{held} of {count} cases held. The repository's working tree after the cases: {tree}.\n\n"
        + ("Not held:\n" + "".join(f"- {line}\n" for line in failed) if failed else "Not held: none.\n")
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", type=Path, default=ROOT / "reports" / "hostile_inputs.md")
    parser.add_argument("--log", type=Path, default=ROOT / "reports" / "hostile_inputs.log")
    parser.add_argument("--only", default="", help="run only the cases whose 'KIND: NAME' matches")
    args = parser.parse_args()
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # the sessions load racecheck's plugin alone
    cases = [c for m in MODULES for c in m.cases() if re.search(args.only, f"{c.kind}: {c.name}")]
    revision = subprocess.run(
        ["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    started, tally, failed, tree = time.monotonic(), {k: [0, 0] for k in KINDS}, [], working_tree()
    lines = [f"# python bench/hostile_inputs.py at {revision}, {datetime.date.today()}: {len(cases)} cases"]
    print(lines[0], flush=True)
    with tempfile.TemporaryDirectory(prefix="hostile-") as tmp:
        base = Path(tmp)
        make_fixtures(base / "fixtures")
        witness = base / "witness"
        write_project(witness)
        for i, case in enumerate(cases):
            found, said = run_case(case, base / "cases" / f"{i:03d}", base / "fixtures", witness)
            tally[case.kind][0] += 1
            tally[case.kind][1] += not found
            name = case.name.replace("\n", "\\n")
            line = f"{'held' if not found else 'NOT HELD'}: {case.kind}: {name}: expected {expected(case)}, {said}"
            line += f" -- {'; '.join(found)}" if found else ""
            failed += [line] if found else []
            lines.append(line)
            print(line, flush=True)
    same = "as before them" if working_tree() == tree else "CHANGED by them"
    text = report(tally, time.monotonic() - started, revision, failed, same)
    lines.append(f"# {sum(t[1] for t in tally.values())} of {len(cases)} cases held")
    print(text, end="")
    if not args.only:
        args.report.write_text(text, encoding="utf-8")
        args.log.write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
