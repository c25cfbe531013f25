"""The schedule of a session: which block (one trial of one arm, with the perturbation it runs)
each repeat step of the plugin runs. The runner writes it (write_schedule) before it starts a
session and passes its path with --racecheck-schedule; every rank reads it (read_schedule).

[Note: resolved specs] A block carries the canonical spec of its arm's profile, resolved by the
runner once (RunConfig.spec_for: none under --no-perturb or `--perturb off`, else the arm's own,
else --perturb, else the suite's default), so that
a rank never decides the precedence again: it parses each spec once and runs it. A block without
one (`""`, a session started by hand) runs what the test itself defaults to.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from pathlib import Path


@dataclasses.dataclass(frozen=True, order=True)
class Block:
    trial: int
    arm: str
    # The canonical perturbation spec the block runs [Note: resolved specs]; "" where the test's
    # own default decides. Not part of a block's identity.
    perturb: str = dataclasses.field(default="", compare=False)
    # The tests of this block that already have their outcome: an earlier session ended (a crash,
    # a hang) inside the block, and the next one resumes it after them ([Note: resumed blocks] in
    # runner/blocks.py).
    done: tuple[str, ...] = dataclasses.field(default=(), compare=False)


def write_schedule(path: Path, blocks: Iterable[Block]) -> None:
    """The schedule file of a session whose steps run `blocks`, in order."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"blocks": [block_to_json(b) for b in blocks]}) + "\n")


def block_to_json(b: Block) -> list:
    """[trial, arm, perturb], with the tests already done as a fourth item where there are any."""
    return [b.trial, b.arm, b.perturb] + ([list(b.done)] if b.done else [])


def block_from_json(item) -> Block:
    """A block of [trial, arm], [trial, arm, perturb] or [trial, arm, perturb, done]."""
    perturb = str(item[2]) if len(item) > 2 else ""
    done = tuple(str(t) for t in item[3]) if len(item) > 3 else ()
    return Block(int(item[0]), str(item[1]), perturb, done)


def read_schedule(path: str | Path) -> list[Block]:
    """The blocks of a schedule file (block_from_json each); ValueError (one line) when it is
    unreadable."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        return [block_from_json(b) for b in data["blocks"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"cannot read the schedule {path}: {exc}") from None
