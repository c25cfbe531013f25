"""The hostile probe's cases of run folders: a finished run's files spoiled one at a time and read
by one command each (report, gate, merge, --resume; bench/bad_run_folders.py tries every reader on
many more), `--out` folders that hold someone else's files or links out of the folder, output
files that are the run's own, names the file system cannot look up, a suite changed under a
resume, and a folder another racecheck process holds. Each is one line and its exit code; a
refused case leaves the run's own files, and the foreign ones, as they were."""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

from hostile_kit import Case, Ctx, Result, as_process

GATE = ("gate", "{done}", "--fixed", "good", "--baseline", "bad")
READERS = {
    "report": ("report", "{done}"),
    "gate": GATE,
    "merge": ("merge", "{s1}", "{s2}", "--out", "{c}/m"),  # s2 spoiled
    "resume": ("run", "--resume", "{done}", "-q"),
}


def _edit(name: str, change, run: str = "done"):
    """Prepare: the copy of the finished run (or of a shard), its file `name` passed through `change(path)`."""

    def prepare(ctx: Ctx) -> None:
        change(ctx.fixture(run) / name)

    return prepare


def _replace_with_folder(path: Path) -> None:
    path.unlink()
    path.mkdir()


def _json(change):
    def edit(path: Path) -> None:
        data = json.loads(path.read_text())
        path.write_text(json.dumps(change(data)))

    return edit


def _record(field: str, value):
    def edit(path: Path) -> None:
        lines = path.read_text().splitlines()
        record = json.loads(lines[1])
        record[field] = value
        lines[1] = json.dumps(record)
        path.write_text("\n".join(lines) + "\n")

    return edit


def _insert(text: str):
    def edit(path: Path) -> None:
        lines = path.read_text().splitlines()
        path.write_text("\n".join([lines[0], text, *lines[1:]]) + "\n")

    return edit


def _append(text: str):
    def edit(path: Path) -> None:
        with open(path, "a") as fh:
            fh.write(text)

    return edit


def _link_to_foreign(name: str, target: str = "trials.jsonl"):
    def edit(path: Path) -> None:
        own = path.parent / name
        if own.is_file():
            own.unlink()
        own.symlink_to(path.parent.parent / "foreign" / target)

    return edit


SPOILED = [
    ("trials.jsonl is a folder", "report", "trials.jsonl", _replace_with_folder, "trials.jsonl"),
    ("run.json a JSON array", "gate", "run.json", lambda p: p.write_text("[1, 2]"), "run.json"),
    ('run.json "chunk": 0', "resume", "run.json", _json(lambda d: {**d, "chunk": 0}), "chunk"),
    ("run.json of binary bytes", "report", "run.json", lambda p: p.write_bytes(b"\x89PNG\x00\xff"), "run.json"),
    ('run.json "trials": -3', "merge", "run.json", _json(lambda d: {**d, "trials": -3}), "trials"),
    ("a record of trial 10**30", "gate", "trials.jsonl", _record("trial", 10**30), "10000000000"),
    ('a record of trial "zero"', "merge", "trials.jsonl", _record("trial", "zero"), "trial"),
    ('a record of outcome "weird"', "resume", "trials.jsonl", _record("outcome", "weird"), "weird"),
    ("completed.jsonl is a folder", "resume", "completed.jsonl", _replace_with_folder, "completed.jsonl"),
    ("run.json removed", "resume", "run.json", lambda p: p.unlink(), "run.json"),
    (
        "trials.jsonl a link to someone else's file",
        "resume",
        "trials.jsonl",
        _link_to_foreign("trials.jsonl"),
        "symbolic link",
    ),
    (
        "summary.csv a link to someone else's file",
        "resume",
        "summary.csv",
        _link_to_foreign("summary.csv", "summary.csv"),
        "symbolic link",
    ),
]


def _own_file_as_output(spell):
    """report -o: one of the run's own files, spelled by `spell(done)`; the file stays as it was."""

    def act(ctx: Ctx) -> Result:
        done = ctx.fixture("done")
        before = (done / "trials.jsonl").read_bytes(), (done / "run.json").read_bytes()
        res = ctx.racecheck("report", done, "--format", "csv", "-o", spell(ctx, done))
        after = (done / "trials.jsonl").read_bytes(), (done / "run.json").read_bytes()
        return res if after == before else Result(99, res.out, res.err + "\nthe run's own file changed")

    return act


def _hard_link(ctx: Ctx, done: Path) -> Path:
    os.link(done / "run.json", ctx / "alias.json")
    return ctx / "alias.json"


def _sym_link(ctx: Ctx, done: Path) -> Path:
    (ctx / "alias.jsonl").symlink_to(done / "trials.jsonl")
    return ctx / "alias.jsonl"


def _held_by_another(ctx: Ctx) -> Result:
    """--resume of a folder whose lock another process holds: exit 3, the folder as it was."""
    done = ctx.fixture("done")
    with open(done / "runner.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return as_process(["run", "--resume", str(done), "-q"], cwd=ctx.p, env={})


def _line_break(ctx: Ctx) -> None:
    ctx.fixture("done").rename(ctx / "a\nb")


def _suite_changed(ctx: Ctx) -> None:
    ctx.fixture("done")
    with open(ctx.p / "test_x.py", "a") as fh:
        fh.write("\n\ndef test_added():\n    pass\n")


def _foreign_link(ctx: Ctx) -> None:
    (ctx / "link").symlink_to(ctx.foreign)


CASES = [
    Case(
        "run folders",
        f"{reader}: {name}",
        2,
        says,
        argv=READERS[reader],
        prepare=_edit(file, change, "s2" if reader == "merge" else "done"),
    )
    for name, reader, file, change, says in SPOILED
]
LONG = "x" * 300
CASES += [
    Case("run folders", "run --out a folder that holds a run", 2, "holds|already", argv=("run", "--out", "{done}")),
    Case(
        "run folders",
        "run --out a folder of someone else's files",
        2,
        "foreign|holds",
        argv=("run", "--out", "{foreign}", "-q"),
    ),
    Case(
        "run folders",
        "run --out a link to a folder of someone else's files",
        2,
        "link",
        argv=("run", "--out", "{c}/link", "-q"),
        prepare=_foreign_link,
    ),
    Case(
        "run folders",
        "merge --out a folder of someone else's files",
        2,
        "foreign",
        argv=("merge", "{s1}", "{s2}", "--out", "{foreign}"),
    ),
    Case(
        "run folders",
        "merge --out a folder that holds a run",
        2,
        "holds|already",
        argv=("merge", "{s1}", "{s2}", "--out", "{done}"),
    ),
    Case(
        "run folders",
        "run --out a folder that holds a run, named with a line break",
        2,
        "already holds",
        argv=("run", "--out", "{c}/a\nb", "-q"),
        prepare=_line_break,
    ),
    Case("run folders", "run --out a file", 2, "--out", argv=("run", "--out", "{p}/test_x.py", "-q")),
    Case("run folders", "run --out a name of 300 bytes", 2, "long|255", argv=("run", "--out", LONG, "-q")),
    Case("run folders", "report a name of 300 bytes", 2, "long|255", argv=("report", LONG)),
    Case(
        "run folders",
        "--resume a name of 300 bytes below a new folder",
        2,
        "long|255",
        argv=("run", "--resume", f"new/{LONG}"),
    ),
    Case(
        "run folders",
        "report -o the run's trials.jsonl",
        2,
        "own",
        act=_own_file_as_output(lambda ctx, done: done / "trials.jsonl"),
    ),
    Case(
        "run folders",
        "report -o the run's run.json spelled through ./ and ..",
        2,
        "own",
        act=_own_file_as_output(lambda ctx, done: done / ".." / "done" / "." / "run.json"),
    ),
    Case("run folders", "report -o a hard link to the run's run.json", 2, "own", act=_own_file_as_output(_hard_link)),
    Case(
        "run folders",
        "report -o a symbolic link to the run's trials.jsonl",
        2,
        "own",
        act=_own_file_as_output(_sym_link),
    ),
    Case("run folders", "--resume of a folder another process holds", 3, "in use", act=_held_by_another),
    Case(
        "run folders",
        "--resume after a test was added to the suite",
        2,
        "--allow-changed-suite",
        argv=("run", "--resume", "{done}", "--trials", "4", "-q"),
        prepare=_suite_changed,
    ),
    Case(
        "run folders",
        "--resume --allow-changed-suite after a test was added",
        0,
        argv=("run", "--resume", "{done}", "--trials", "4", "--allow-changed-suite", "-q"),
        prepare=_suite_changed,
    ),
    Case(
        "run folders",
        "report: a line of NUL bytes amid trials.jsonl (said, skipped)",
        0,
        "not JSON.*skipped",
        argv=("report", "{done}"),
        prepare=_edit("trials.jsonl", _insert("\x00\x00\x00")),
    ),
    Case(
        "run folders",
        "--resume after a torn last line",
        0,
        "rejected|torn",
        argv=("run", "--resume", "{done}", "-q"),
        prepare=_edit("trials.jsonl", _append('{"run_id": "x", "sce')),
        keeps="done",
    ),
]


def cases() -> list[Case]:
    return CASES
