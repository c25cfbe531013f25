"""The hostile probe's cases of failing disks: a file-size limit under a run (EFBIG), a small
tmpfs that a test of the suite fills under the run (ENOSPC), a trial log it makes immutable
(EPERM), a run folder that is full or read-only from the start, the outputs of report and merge on
a full disk, a console on a full disk (/dev/full), and a summary.csv that cannot be written at the
end. A run stops in one line with exit 3 and keeps every finished trial; a folder that cannot be
written before anything ran is exit 2. The tmpfs cases mount a file system inside the case's
folder, and the immutable log needs chattr on ext4: the probe runs as root (elsewhere those cases
say they could not be carried out)."""

from __future__ import annotations

import resource
import subprocess
from pathlib import Path

from hostile_faults import suite
from hostile_kit import Case, Ctx, Result, as_process, command, kept

FILL = """
import os


def test_a_ok():
    pass


def test_b_fills():
    if not os.path.exists(os.environ["HOSTILE_DONE"]):
        open(os.environ["HOSTILE_DONE"], "w").close()
        {action}


def test_c_ok():
    pass
"""
FILL_DISK = "with open(os.environ['HOSTILE_FILL'], 'wb') as fh:\n            fh.write(b'x' * (1 << 22))"
# A remount read-only fails while the runner holds its logs open for writing (EBUSY), so the
# write the file system refuses mid-run is an immutable log instead (ext4 refuses writes to it
# through open files too).
IMMUTABLE = "os.system('chattr +i ' + os.environ['HOSTILE_LOG'])"


class Tmpfs:
    """A tmpfs of `size` mounted at `path` for the time of a `with`."""

    def __init__(self, path: Path, size: str = "256k") -> None:
        self.path, self.size = path, size

    def __enter__(self) -> Path:
        self.path.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={self.size}", "tmpfs", str(self.path)],
            check=True,
            capture_output=True,
        )
        return self.path

    def remount(self, mode: str) -> None:
        subprocess.run(["mount", "-o", f"remount,{mode}", str(self.path)], check=True, capture_output=True)

    def __exit__(self, *exc) -> None:
        subprocess.run(["umount", "-l", str(self.path)], capture_output=True)


def _full_under_run(ctx: Ctx) -> Result:
    """A run folder on a tmpfs that the suite's middle test fills, in trial 0."""
    suite({"test_x.py": FILL.format(action=FILL_DISK)})(ctx)
    with Tmpfs(ctx / "disk", "1m") as disk:
        env = {"HOSTILE_DONE": str(ctx / "done-once"), "HOSTILE_FILL": str(disk / "filler")}
        res = ctx.racecheck("run", "--trials", "3", "--out", disk / "out", "-q", env=env, process=True)
        (disk / "filler").unlink(missing_ok=True)
        ctx.note(kept(ctx, disk / "out"))
    return res


def _immutable_under_run(ctx: Ctx) -> Result:
    """A trial log that the suite's middle test makes immutable (chattr +i), in trial 0."""
    suite({"test_x.py": FILL.format(action=IMMUTABLE)})(ctx)
    log = ctx / "out" / "trials.jsonl"
    env = {"HOSTILE_DONE": str(ctx / "done-once"), "HOSTILE_LOG": str(log)}
    try:
        res = ctx.racecheck("run", "--trials", "3", "--out", ctx / "out", "-q", env=env, process=True)
    finally:
        subprocess.run(["chattr", "-i", str(log)], capture_output=True)
    ctx.note(kept(ctx, ctx / "out"))
    return res


def _limited(limit: int):
    def limit_files() -> None:  # in the runner: its files, and its children's, stop at `limit` bytes
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return limit_files


def _file_size_limit(ctx: Ctx) -> Result:
    return as_process(
        ["run", "--trials", "4", "--out", str(ctx / "out"), "-q"], cwd=ctx.p, env={}, preexec_fn=_limited(2048)
    )


def _on_disk(state: str, argv: tuple):
    """`racecheck ARGV` with {disk} a tmpfs that is full or read-only from the start."""

    def act(ctx: Ctx) -> Result:
        with Tmpfs(ctx / "disk", "64k") as disk:
            if state == "full":
                _fill(disk)
            else:
                Tmpfs(disk).remount("ro")
            args = [a.replace("{disk}", str(disk)) for a in argv]
            return ctx.racecheck(*args)

    return act


def _fill(disk: Path) -> None:
    try:
        with open(disk / "filler", "wb") as fh:
            while True:
                fh.write(b"x" * 4096)
                fh.flush()
    except OSError:
        pass


def _to_full(argv: tuple):
    """racecheck ARGV with its standard output on /dev/full (every write: ENOSPC)."""

    def act(ctx: Ctx) -> Result:
        with open("/dev/full", "w") as full:
            proc = subprocess.run(
                command(ctx.args(argv)), cwd=ctx.p, stdout=full, stderr=subprocess.PIPE, text=True, timeout=300
            )
        return Result(proc.returncode, "", proc.stderr)

    return act


def _summary_a_folder(ctx: Ctx) -> None:
    (ctx.fixture("done") / "summary.csv").unlink()
    (ctx.fixture("done") / "summary.csv").mkdir()


CASES = [
    Case(
        "disks",
        "a file-size limit under the run (EFBIG)",
        3,
        "cannot write.*--resume",
        act=_file_size_limit,
        keeps="out",
    ),
    Case(
        "disks",
        "a tmpfs that a test fills under the run (ENOSPC)",
        3,
        "cannot write.*No space",
        act=_full_under_run,
    ),
    Case(
        "disks",
        "a trial log that a test makes immutable under the run (EPERM)",
        3,
        "cannot write.*not permitted",
        act=_immutable_under_run,
    ),
    Case(
        "disks",
        "run --out on a full tmpfs",
        2,
        "cannot|No space",
        act=_on_disk("full", ("run", "--trials", "1", "--out", "{disk}/out", "-q")),
    ),
    Case(
        "disks",
        "run --out on a read-only tmpfs",
        2,
        "cannot|Read-only",
        act=_on_disk("ro", ("run", "--trials", "1", "--out", "{disk}/out", "-q")),
    ),
    Case(
        "disks",
        "report -o on a full tmpfs",
        2,
        "No space",
        act=_on_disk("full", ("report", "{done}", "-o", "{disk}/table.txt")),
    ),
    Case(
        "disks",
        "merge --out on a full tmpfs",
        2,
        "No space",
        act=_on_disk("full", ("merge", "{s1}", "{s2}", "--out", "{disk}/m")),
    ),
    Case(
        "disks",
        "run with its standard output on a full disk (> /dev/full)",
        3,
        "standard output.*No space",
        act=_to_full(("run", "--trials", "2", "--out", "{c}/out")),
        keeps="out",
    ),
    Case(
        "disks",
        "report with its standard output on a full disk (> /dev/full)",
        3,
        "standard output.*No space",
        act=_to_full(("report", "{done}")),
    ),
    Case(
        "disks",
        "summary.csv that cannot be written at the end",
        3,
        "summary.csv",
        argv=("run", "--resume", "{done}", "--trials", "4", "-q"),
        prepare=_summary_a_folder,
    ),
]


def cases() -> list[Case]:
    return CASES
