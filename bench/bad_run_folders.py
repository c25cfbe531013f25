"""Bad run folders through every command that reads one: a finished run's trials.jsonl, run.json
and completed.jsonl spoiled one way at a time (a field of the wrong type or range, a trial past
the run's plan, a file that cannot be read, a setting that does not read back), folders `--out`
must not take, and folder names the file system cannot look up. Each case runs `report`, `gate`,
`run --resume` and `merge` (all four read every file of the folder), and counts as
handled when each command exits with the code the README gives and says why in one line (its last
line of stderr; warnings before it are allowed) without a traceback. Prints one line per case and
the tally, and writes the tally to reports/bad_run_folders.md.

    .venv/bin/python bench/bad_run_folders.py [--report reports/bad_run_folders.md]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import sys
import tempfile
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from racecheck.cli import main as racecheck_main  # noqa: E402

SUITE = """
import os, random
import pytest

@pytest.mark.parametrize("case", ["x", "y"])
def test_draw(case, racecheck_arm, racecheck_seed):
    rate = {"often": 0.6}.get(racecheck_arm, 0.0)
    assert random.Random(f"{racecheck_seed}-{case}").random() >= rate
"""
PROJECT = '[tool.racecheck]\nname = "tiny"\n\n[tool.racecheck.arms.often]\n[tool.racecheck.arms.never]\n'

# A field of the third record set to a value, or the line replaced by raw text.
RECORD_FIELDS = [
    ("trial", "zero"),
    ("trial", True),
    ("trial", -1),
    ("trial", 1.5),
    ("trial", None),
    ("trial", 4),  # the run planned trials 0 to 3
    ("trial", 10**30),
    ("outcome", "weird"),
    ("outcome", None),
    ("outcome", 3),
    ("arm", ["often"]),
    ("arm", None),
    ("scenario", 5),
    ("test", {"a": 1}),
    ("seed", "x"),
    ("duration", "slow"),
    ("detect", "yes"),
    ("detected", "2"),
    ("reports", "text"),
    ("delayed", "x"),
    ("actions", [1]),
    ("handoffs", "3"),
    ("versions", []),
    ("expect", "maybe"),
    ("run_id", None),
]
RECORD_LINES = ["[1, 2]", '"a string"', "42", "null", '{"arm": "often"}']
RUN_SETTINGS = [
    ("chunk", 0),
    ("chunk", -1),
    ("chunk", "5"),
    ("trials", "x"),
    ("trials", 0),
    ("trials", -3),
    ("seed", "s"),
    ("isolation", "threads"),
    ("order", "sideways"),
    ("backend", "tpu"),
    ("timeout", 0),
    ("timeout", "x"),
    ("timeout", float("nan")),  # json.dumps writes a bare NaN
    ("timeout", float("inf")),
    ("detect", "yes"),
    ("pytest_args", "-x"),
    ("pytest_args", [1]),
    ("world_size", 0),
    ("mesh", "3"),
    ("shard", "3/2"),
    ("shard", 5),
    ("perturb", "sleep@nowhere"),
    ("perturb", 5),
    ("arms", "often"),
    ("revisions", []),
    ("source", "x"),
    ("source", {"kind": "zzz"}),
    ("attempts", 5),
    ("attempts", [{"trials": 0}]),
    ("skipped", {"tiny": 5}),
]


def racecheck(*args, cwd: Path) -> tuple[int, str]:
    err = io.StringIO()
    argv, old = sys.argv, os.getcwd()
    sys.argv = ["racecheck", *map(str, args)]
    code = 0
    try:
        os.chdir(cwd)
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            racecheck_main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except Exception:  # what a console would show as a traceback, exit 1
        code = 1
        err.write(traceback.format_exc())
    finally:
        sys.argv = argv
        os.chdir(old)
    return code, err.getvalue()


def clean(code: int, err: str, expected: int) -> bool:
    lines = [line for line in err.splitlines() if line.strip()]
    return code == expected and "Traceback" not in err and (expected == 0 or lines[-1].startswith("racecheck: "))


class Cases:
    def __init__(self, base: Path, root: Path, finished: Path, other: Path) -> None:
        """`finished`: shard 2/2 of a finished run, which each case copies and spoils; `other`: its
        shard 1/2, which `merge` joins to it."""
        self.base, self.root, self.finished, self.other = base, root, finished, other
        self.count = self.handled = 0

    def folder(self, name: str) -> Path:
        out = self.base / name
        shutil.copytree(self.finished, out)
        return out

    def check(self, name: str, commands: dict[str, tuple], expected: dict[str, int]) -> None:
        results = {cmd: racecheck(*args, cwd=self.root) for cmd, args in commands.items()}
        ok = all(clean(*results[cmd], expected[cmd]) for cmd in commands)
        self.count += 1
        self.handled += ok
        said = "; ".join(f"{cmd} {code}" for cmd, (code, _) in results.items())
        last = next((e.strip().splitlines()[-1] for _, e in results.values() if e.strip()), "")
        print(f"{'handled' if ok else 'NOT HANDLED'}: {name}: {said}: {last[:150]}", flush=True)

    def readers(self, out: Path, *, resume: int = 2, merge: int = 2) -> tuple[dict, dict]:
        commands = {
            "report": ("report", out),
            "gate": ("gate", out, "--fixed", "never", "--baseline", "often"),
            "merge": ("merge", self.other, out, "--out", self.base / f"{out.name}-merged"),
            "resume": ("run", "--resume", out, "-q"),  # last: a resume that runs rewrites the folder
        }
        return commands, {"report": 2, "gate": 2, "resume": resume, "merge": merge}


def spoil_records(cases: Cases) -> None:
    for i, (field, value) in enumerate(RECORD_FIELDS):
        out = cases.folder(f"record-{i}")
        lines = (out / "trials.jsonl").read_text().splitlines()
        record = json.loads(lines[2])
        record[field] = value
        lines[2] = json.dumps(record)
        (out / "trials.jsonl").write_text("\n".join(lines) + "\n")
        cases.check(f"record {field} = {json.dumps(value)}", *cases.readers(out))
    for i, text in enumerate(RECORD_LINES):
        out = cases.folder(f"line-{i}")
        lines = (out / "trials.jsonl").read_text().splitlines()
        (out / "trials.jsonl").write_text("\n".join(lines[:2] + [text] + lines[2:]) + "\n")
        cases.check(f"log line {text}", *cases.readers(out))


def spoil_logs(cases: Cases) -> None:
    def replaced(name: str, make) -> Path:
        out = cases.folder(name)
        (out / "trials.jsonl").unlink()
        make(out / "trials.jsonl")
        return out

    out = replaced("log-dir", lambda p: p.mkdir())
    cases.check("trials.jsonl is a folder", *cases.readers(out))
    out = replaced("log-eio", lambda p: p.symlink_to("/proc/self/mem"))
    cases.check("trials.jsonl fails every read (EIO)", *cases.readers(out))
    out = replaced("log-empty", lambda p: p.write_text(""))
    commands, expected = cases.readers(out, resume=0)  # resuming reruns every trial: nothing was lost
    cases.check("trials.jsonl empty", commands, expected)
    out = replaced("log-garbage", lambda p: p.write_bytes(b"\x00\xff\xfe garbage\nnot json either\n"))
    cases.check("trials.jsonl of lines that are no JSON", *cases.readers(out, resume=0))
    out = cases.folder("completed-dir")
    (out / "completed.jsonl").unlink()
    (out / "completed.jsonl").mkdir()
    cases.check("completed.jsonl is a folder", *cases.readers(out))
    out = cases.folder("completed-phantom")
    line = json.loads((out / "completed.jsonl").read_text().splitlines()[0])
    with open(out / "completed.jsonl", "a") as fh:
        fh.write(json.dumps({**line, "trial": 10**30}) + "\n")
    cases.check("completed.jsonl names trial 10**30", *cases.readers(out))


def spoil_run_json(cases: Cases) -> None:
    for i, (setting, value) in enumerate(RUN_SETTINGS):
        out = cases.folder(f"run-{i}")
        run = json.loads((out / "run.json").read_text())
        run[setting] = value
        (out / "run.json").write_text(json.dumps(run))
        commands, expected = cases.readers(out)
        if setting == "source" and isinstance(value, dict):
            # The source says where --resume reloads the suites from; report and gate need no suite,
            # and read the run as it is (merge compares the sources, and refuses).
            expected.update(report=0, gate=0)
        cases.check(f"run.json {setting} = {json.dumps(value)}", commands, expected)
    for name, text in (
        ("no object", b"[1, 2]"),
        ("not JSON", b"{"),
        ("binary", b"\x89PNG\x00\xff"),
        ("a folder", None),
    ):
        out = cases.folder(f"run-{name.replace(' ', '-')}")
        if text is None:
            (out / "run.json").unlink()
            (out / "run.json").mkdir()
        else:
            (out / "run.json").write_bytes(text)
        cases.check(f"run.json {name}", *cases.readers(out))


def unlookable_folders(cases: Cases) -> None:
    """Folder names the file system cannot look up, given to every command that takes one."""
    for name, where in (
        ("a name of 300 bytes", "x" * 300),
        ("a name of 300 bytes below a new folder", f"new/{'x' * 300}"),
    ):
        shards = [cases.other, cases.finished]
        commands = {
            "run": ("run", "--trials", 1, "--out", where, "-q"),
            "resume": ("run", "--resume", where, "-q"),
            "report": ("report", where),
            "gate": ("gate", where, "--fixed", "never", "--baseline", "often"),
            "merge": ("merge", *shards, "--out", where),
            "merge input": ("merge", cases.other, where, "--out", cases.base / "merged-long"),
        }
        cases.check(f"folder {name}", commands, dict.fromkeys(commands, 2))


def foreign_folders(cases: Cases) -> None:
    mine = cases.base / "mine"
    mine.mkdir()
    (mine / "summary.csv").write_text("precious\n")
    (cases.base / "link").symlink_to(mine)
    shards = [cases.other, cases.finished]
    for where in (mine, cases.base / "link"):
        cases.check(
            f"--out {where.name}: a folder of someone else's files" + (" behind a link" if where.is_symlink() else ""),
            {"run": ("run", "--trials", 1, "--out", where, "-q"), "merge": ("merge", *shards, "--out", where)},
            {"run": 2, "merge": 2},
        )
    ok = (mine / "summary.csv").read_text() == "precious\n" and os.listdir(mine) == ["summary.csv"]
    print(f"the foreign folder is {'untouched' if ok else 'CHANGED'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--report", type=lambda v: Path(v) if v else None, default=ROOT / "reports" / "bad_run_folders.md"
    )
    args = parser.parse_args()
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        root = base / "project"
        root.mkdir()
        (root / "pyproject.toml").write_text(PROJECT)
        (root / "test_draw.py").write_text(SUITE)
        for shard in (1, 2):
            code, err = racecheck(
                "run", "--trials", 4, "--shard", f"{shard}/2", "--out", base / f"shard-{shard}", cwd=root
            )
            assert code == 0, err
        cases = Cases(base, root, base / "shard-2", base / "shard-1")
        for part in (spoil_records, spoil_logs, spoil_run_json, foreign_folders, unlookable_folders):
            part(cases)
    summary = (
        "# Bad run folders through every command that reads them\n\n"
        "`python bench/bad_run_folders.py` (one line per case in `reports/bad_run_folders.log`)\n\n"
        f"{cases.handled} of {cases.count} cases handled: every command that reads the spoiled file exits with the "
        "README's code and one line saying why, no traceback.\n"
    )
    print(summary, end="")
    if args.report:
        args.report.write_text(summary, encoding="utf-8")


if __name__ == "__main__":
    main()
