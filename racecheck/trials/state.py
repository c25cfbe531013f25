"""The run folder's state beside the trial log, what `--resume` and `merge` need:

- `run.json`: the run's definition (suite source, arms, trials, seed, order, isolation, ...), with
  one entry per attempt (the first run and each resume);
- `completed.jsonl`: one line per finished block (suite, arm, trial) and its worst outcome,
  appended and fsynced after the block's last record reached trials.jsonl; a resumed run skips
  exactly these blocks, and reruns any block it does not list (the tally keeps a rerun test's
  last record, so a partly logged block counts once);
- `runner.json`: the live runner's and its current session's process ids, so that a resume can
  refuse a folder in use and kill sessions that a killed runner left behind.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import psutil

from racecheck.trials.schedule import Block

RUN_FILE, COMPLETED_FILE, LOCK_FILE = "run.json", "completed.jsonl", "runner.json"


def read_run(out: Path) -> dict:
    """OUT/run.json; ValueError (one line) when it is missing or unreadable."""
    path = Path(out) / RUN_FILE
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{out}: no {RUN_FILE} (not a racecheck run folder)") from None
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: unreadable: {exc}") from None


def write_run(out: Path, data: dict) -> None:
    tmp = Path(out) / (RUN_FILE + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, Path(out) / RUN_FILE)


class CompletedLog:
    """Append-only record of finished blocks (see the module docstring)."""

    def __init__(self, out: Path) -> None:
        self.path = Path(out) / COMPLETED_FILE
        self._fh = open(self.path, "a", encoding="utf-8")

    def append(self, suite: str, block: Block, outcome: str, run_id: str) -> None:
        self._fh.write(json.dumps({"scenario": suite, "arm": block.arm, "trial": block.trial,
                                   "outcome": outcome, "run_id": run_id}) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        self._fh.close()


def read_completed(out: Path) -> dict[tuple[str, str, int], str]:
    """(suite, arm, trial) -> worst outcome of every finished block (a torn last line is skipped)."""
    done = {}
    try:
        lines = (Path(out) / COMPLETED_FILE).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return done
    for line in lines:
        try:
            d = json.loads(line)
            done[(d["scenario"], d["arm"], int(d["trial"]))] = d["outcome"]
        except (ValueError, KeyError, TypeError):
            continue
    return done


def _identity(pid: int) -> dict:
    return {"pid": pid, "started": psutil.Process(pid).create_time()}


def _alive(ident: dict | None) -> psutil.Process | None:
    """The process `ident` names, if it still runs (a reused pid does not match its start time)."""
    if not ident:
        return None
    try:
        p = psutil.Process(int(ident["pid"]))
        return p if abs(p.create_time() - float(ident["started"])) < 0.01 else None
    except (psutil.Error, KeyError, TypeError, ValueError):
        return None


class Lock:
    """OUT/runner.json while a runner works in OUT."""

    def __init__(self, out: Path) -> None:
        self.path = Path(out) / LOCK_FILE
        self._data = {"runner": _identity(os.getpid()), "session": None}

    def acquire(self) -> list[int]:
        """Take the folder; returns the ids of left-over session processes it killed. ValueError
        when another live runner holds it."""
        killed = []
        try:
            old = json.loads(self.path.read_text())
        except (OSError, ValueError):
            old = {}
        runner = _alive(old.get("runner"))
        if runner is not None and runner.pid != os.getpid():
            raise ValueError(f"{self.path.parent} is in use by racecheck (pid {runner.pid})")
        session = _alive(old.get("session"))
        if session is not None:
            from racecheck.trials.launch import kill_process_tree

            killed = [session.pid]
            kill_process_tree(session.pid)
        self._write()
        return killed

    def session(self, pid: int | None) -> None:
        self._data["session"] = _identity(pid) if pid is not None else None
        self._write()

    def release(self) -> None:
        try:
            self.path.unlink()
        except OSError:
            pass

    def _write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self._data) + "\n")
        os.replace(tmp, self.path)
