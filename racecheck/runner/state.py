"""The run folder's state beside the trial log, what `--resume` and `merge` need:

- `run.json`: the run's definition (suite source, arms, trials, seed, order, isolation, ...), with
  one entry per attempt (the first run and each resume);
- `completed.jsonl`: one line per finished block (suite, arm, trial) and its worst outcome,
  appended and fsynced after the block's last record reached trials.jsonl; a resumed run skips
  exactly these blocks, and reruns any block it does not list (the tally keeps a rerun test's
  last record, so a partly logged block counts once);
- `runner.lock` and `runner.json`: the live runner's lock on the folder, and its own and its
  current session's identities (Lock).

A run or a merge writes only into a folder that is new, empty, or already racecheck's
(check_out_folder): never into one that holds someone else's files.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import secrets
from pathlib import Path

import psutil

from racecheck.protocol.durable import AppendFile, names
from racecheck.protocol.names import LOCK_NAME, RUNNER_TOKEN_VAR
from racecheck.protocol.schedule import Block
from racecheck.runner.trial_log import outside_plan

RUN_FILE, COMPLETED_FILE, LOCK_FILE = "run.json", "completed.jsonl", "runner.json"
LOG_FILE = "trials.jsonl"


def read_run(out: Path) -> dict:
    """OUT/run.json as a JSON object; ValueError (one line) when it is missing, unreadable or no
    object. Its settings are checked where they are read back (RunConfig.settings_from_json)."""
    path = Path(out) / RUN_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{out}: no {RUN_FILE} (not a racecheck run folder)") from None
    except OSError as exc:
        raise ValueError(f"{path}: unreadable: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ValueError(f"{path}: unreadable: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a JSON object")
    return data


class ForeignFolder(ValueError):
    """A folder that holds files and no racecheck run: no run or merge writes into it."""


def is_run_folder(folder: Path) -> bool:
    """Whether `folder` holds a racecheck run: the lock file a runner or a merge takes before it
    writes anything else, or a run.json that reads as a run's."""
    if (folder / LOCK_NAME).is_file():
        return True
    try:
        return "source" in read_run(folder)
    except ValueError:
        return False


def check_out_folder(out: Path) -> None:
    """ForeignFolder (one line) unless a run or a merge may write into `out`: a folder that does
    not exist yet, an empty one, or one that holds a racecheck run (is_run_folder; whether it may
    take another run is the runner's or the merge's to say). A symbolic link is judged by the
    folder it leads to, so that it leads no run into someone else's folder."""
    out = Path(out)
    target = out.resolve() if out.is_symlink() else out
    try:
        if not target.is_dir() or _only_node_folders(target) or is_run_folder(target):
            return  # a new folder, or something that creating or writing it reports
    except OSError:
        return  # unreadable: writing to it says so
    where = f"{out} (a link to {target})" if out.is_symlink() else str(out)
    raise ForeignFolder(f"{where} holds files and no racecheck run; give a new or an empty folder")


def _only_node_folders(folder: Path) -> bool:
    """Whether `folder` is empty but for its follower nodes' folders (OUT/nodes/node-R, which
    the nodes of a run across nodes on one file system may create before node 0 takes OUT)."""
    entries = list(folder.iterdir())
    if not entries:
        return True
    if [e.name for e in entries] != ["nodes"] or not entries[0].is_dir():
        return False
    return all(e.is_dir() and re.fullmatch(r"node-\d+", e.name) for e in entries[0].iterdir())


def write_run(out: Path, data: dict) -> None:
    _replace(Path(out) / RUN_FILE, json.dumps(data, indent=2) + "\n")


class CompletedLog:
    """Append-only record of finished blocks (see the module docstring), written through `file`
    (durable.AppendFile: each line fsynced, whole or not at all)."""

    def __init__(self, out: Path) -> None:
        self.path = Path(out) / COMPLETED_FILE
        self.file = AppendFile(self.path)

    def append(self, suite: str, block: Block, outcome: str, run_id: str, *, records: int) -> None:
        """`records`: how many lines of trials.jsonl the block wrote; a resume that finds fewer
        runs the block again (a record was lost to a torn or removed line). OSError where the
        file system refuses the line."""
        line = {
            "scenario": suite,
            "arm": block.arm,
            "trial": block.trial,
            "outcome": outcome,
            "run_id": run_id,
            "records": records,
        }
        self.file.append((json.dumps(line) + "\n").encode("utf-8"))

    def close(self) -> None:
        self.file.close()


def read_completed(out: Path, *, trials: int | None = None) -> dict[tuple[str, str, int], tuple[str, int | None]]:
    """(suite, arm, trial) -> (worst outcome, records it wrote, None where not noted) of every
    finished block; a line that does not parse (a torn last line) is skipped: its block reruns.
    ValueError (one line) when the file exists and cannot be read, or, given the run's planned
    `trials`, names a trial past them (runner/run_folder.py)."""
    done: dict[tuple[str, str, int], tuple[str, int | None]] = {}
    path = Path(out) / COMPLETED_FILE
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except FileNotFoundError:
        return done
    except OSError as exc:
        raise ValueError(f"{path}: unreadable: {exc.strerror or exc}") from None
    for number, line in enumerate(lines, 1):
        try:
            d = json.loads(line)
            records = d.get("records")
            key = (d["scenario"], d["arm"], int(d["trial"]))
            noted = (d["outcome"], int(records) if records is not None else None)
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
        if trials is not None and not 0 <= key[2] < trials:
            raise ValueError(f"{path}:{number}: trial {key[2]} {outside_plan(trials)}")
        done[key] = noted
    return done


def _identity(pid: int) -> dict:
    """What proves later that a pid is still the process we meant: its start time and command."""
    p = psutil.Process(pid)
    return {"pid": pid, "started": p.create_time(), "cmdline": p.cmdline()}


def _alive(ident: dict | None) -> psutil.Process | None:
    """The session `ident` names, if it still runs and provably is a racecheck session: the same
    pid, start time and command line (a reused pid matches neither), and the runner's token in its
    environment. runner.json is only a file: anyone can write a foreign process's pid, start time
    and command line into it, but not the token into that process's environment, so a process
    whose environment cannot be read (another user's) or lacks the token is never touched."""
    if not isinstance(ident, dict) or "cmdline" not in ident or not ident.get("token"):
        return None  # written without the proof: never act on it
    try:
        p = psutil.Process(int(ident["pid"]))
        if abs(p.create_time() - float(ident["started"])) >= 0.01 or p.cmdline() != ident["cmdline"]:
            return None
        if p.environ().get(RUNNER_TOKEN_VAR) == ident["token"]:
            return p
    except (psutil.Error, KeyError, TypeError, ValueError):
        pass
    return None


class FolderInUse(RuntimeError):
    """Another racecheck process holds the run folder."""


class Lock:
    """The run folder held by one runner: an exclusive `flock` on OUT/runner.lock for the whole
    run (the kernel drops it when the process dies, however it dies), and OUT/runner.json with the
    runner's and its current session's identities, so that a later runner can kill a session left
    behind, once it proves that the process is that session (_alive). Every session the runner
    starts carries `session_env()` in its environment for that proof."""

    def __init__(self, out: Path) -> None:
        self.out = Path(out)
        self.path = self.out / LOCK_FILE
        self.token = secrets.token_hex(16)
        self._fd: int | None = None
        self._data: dict = {"runner": None, "session": None}

    def session_env(self) -> dict[str, str]:
        """The environment entry that marks a session as this runner's."""
        return {RUNNER_TOKEN_VAR: self.token}

    def acquire(self) -> list[int]:
        """Take the folder; returns the ids of left-over session processes it killed. FolderInUse
        when another process holds it; OSError when the folder cannot be written."""
        fd = os.open(self.out / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = (_read_json(self.path).get("runner") or {}).get("pid", "unknown")
            raise FolderInUse(f"{self.out} is in use by another racecheck run (pid {holder})") from None
        self._fd = fd
        killed = []
        session = _alive(_read_json(self.path).get("session"))
        if session is not None:  # provably the session a killed runner started
            from racecheck.runner.launch import kill_process_tree

            killed = [session.pid]
            kill_process_tree(session.pid)
        self._data = {"runner": _identity(os.getpid()), "session": None}
        self._write()
        return killed

    def gone(self) -> bool:
        """Whether the lock file this runner holds was removed or replaced under it (the run
        folder deleted by a test): the folder is then no longer held against another runner."""
        return self._fd is not None and not names(self.out / LOCK_NAME, self._fd)

    def retake(self) -> None:
        """Hold the folder again after gone(): a new lock file, and runner.json. FolderInUse when
        another process took the folder meanwhile; OSError when it cannot be written."""
        self.out.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.out / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise FolderInUse(f"{self.out} was removed under this run and another racecheck run took it") from None
        if self._fd is not None:
            os.close(self._fd)
        self._fd = fd
        self._write()

    def session(self, pid: int | None) -> None:
        try:
            self._data["session"] = {**_identity(pid), "token": self.token} if pid is not None else None
        except psutil.NoSuchProcess:  # it died at once: nothing to prove later
            self._data["session"] = None
        self._write()

    def release(self) -> None:
        try:
            self.path.unlink()
        except OSError:
            pass
        if self._fd is not None:
            os.close(self._fd)  # drops the flock
            self._fd = None

    def _write(self) -> None:
        _replace(self.path, json.dumps(self._data) + "\n")


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _replace(path: Path, text: str) -> None:
    """Write `path` whole or not at all, through a temporary file of this process's own."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
