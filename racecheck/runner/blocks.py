"""Which trial of which arm runs when: blocks, arm orders, shards, and the sessions that run them.

A block is one trial of one arm: every selected test once, with the trial's seed. A run's blocks
are trial-major: trial 0 of every arm, then trial 1, ...; inside a trial the arms come in the
given order (`alternate`: A B A B) or in a seeded random order (`random`, a fresh permutation per
trial, so every arm still runs once per trial and drift over time hits all arms alike).

[Note: sessions] A session is one pytest invocation (one process world) running a list of blocks,
one per repeat step of the plugin. In `process` isolation every block gets a session of its own. In
`session` isolation all blocks of arms that can share a process (catalogue.Arm.process_key) run in
one session; when the arms need different processes (env, pytest args, git revision), each group
runs its blocks in sessions of `chunk` trials, and the groups alternate chunk by chunk.

This module is imported by the pytest plugin: it must stay free of heavy imports.
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
from pathlib import Path

ORDERS = ("alternate", "random")


@dataclasses.dataclass(frozen=True, order=True)
class Block:
    trial: int
    arm: str
    # The canonical perturbation spec the block runs (RunConfig.spec_for), written into the
    # session schedule so that every rank parses it once; "" where the pytest options decide.
    # Not part of a block's identity.
    perturb: str = dataclasses.field(default="", compare=False)


def arm_order(arms, trial: int, *, seed: int, order: str) -> tuple[str, ...]:
    """The arms of trial `trial` in the order they run."""
    arms = tuple(arms)
    if order == "alternate" or len(arms) < 2:
        return arms
    if order != "random":
        raise ValueError(f"unknown order {order!r}; known: {', '.join(ORDERS)}")
    shuffled = list(arms)
    random.Random(f"racecheck-order:{seed}:{trial}").shuffle(shuffled)
    return tuple(shuffled)


def blocks(arms, trials, *, seed: int, order: str) -> list[Block]:
    """Every block of `trials` (an iterable of trial indices) x `arms`, in run order."""
    return [Block(t, a) for t in trials for a in arm_order(arms, t, seed=seed, order=order)]


@dataclasses.dataclass(frozen=True)
class Shard:
    """Slice `index` (1-based) of `count`: a contiguous range of trial indices, every arm."""

    index: int = 1
    count: int = 1

    @classmethod
    def parse(cls, text: str) -> Shard:
        m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text or "")
        if not m:
            raise ValueError(f"{text!r} is not of the form i/N (for example 1/4)")
        index, count = int(m[1]), int(m[2])
        if count < 1 or not 1 <= index <= count:
            raise ValueError(f"{text!r}: need 1 <= i <= N (shards are numbered from 1)")
        return cls(index, count)

    def trials(self, total: int) -> range:
        return range((self.index - 1) * total // self.count, self.index * total // self.count)

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


@dataclasses.dataclass(frozen=True)
class SessionPlan:
    """The blocks one pytest session runs, in order (one repeat step of the plugin each)."""

    blocks: tuple[Block, ...]

    @property
    def arms(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(b.arm for b in self.blocks))

    @property
    def trials(self) -> tuple[int, ...]:
        return tuple(dict.fromkeys(b.trial for b in self.blocks))


def sessions(
    pending: list[Block], *, groups: list[tuple[str, ...]], isolation: str, chunk: int, seed: int, order: str
) -> list[SessionPlan]:
    """Split pending blocks (in run order) into sessions; see [Note: sessions]."""
    if not pending:
        return []
    if isolation == "process":
        return [SessionPlan((b,)) for b in pending]
    if len(groups) <= 1:
        return [SessionPlan(tuple(pending))]
    trials = list(dict.fromkeys(b.trial for b in pending))
    plans = []
    for k in range(0, len(trials), chunk):
        window = set(trials[k : k + chunk])
        chosen = list(groups)
        if order == "random":
            random.Random(f"racecheck-groups:{seed}:{trials[k]}").shuffle(chosen)
        for group in chosen:
            part = tuple(b for b in pending if b.trial in window and b.arm in group)
            if part:
                plans.append(SessionPlan(part))
    return plans


# -- the schedule file: how the runner tells the plugin which block each repeat step is ----------
def write_schedule(path: Path, plan: SessionPlan) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"blocks": [[b.trial, b.arm, b.perturb] for b in plan.blocks]}) + "\n")


def read_schedule(path: str | Path) -> list[Block]:
    """The blocks of a schedule file ([trial, arm] or [trial, arm, perturb] each); ValueError
    (one line) when it is unreadable."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        return [Block(int(b[0]), str(b[1]), str(b[2]) if len(b) > 2 else "") for b in data["blocks"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"cannot read the schedule {path}: {exc}") from None
