"""Which trial of which arm runs when: blocks, arm orders, shards, and the sessions that run them.

A block (protocol/schedule.py) is one trial of one arm: every selected test once, with the trial's
seed. A run's blocks
are trial-major: trial 0 of every arm, then trial 1, ...; inside a trial the arms come in the
given order (`alternate`: A B A B) or in a seeded random order (`random`, a fresh permutation per
trial, so every arm still runs once per trial and drift over time hits all arms alike).

[Note: sessions] A session is one pytest invocation (one process world) running a list of blocks,
one per repeat step of the plugin. In `process` isolation every block gets a session of its own. In
`session` isolation all blocks of arms that can share a process (catalogue.Arm.process_key) run in
one session; when the arms need different processes (env, pytest args, git revision), each group
runs its blocks in sessions of `chunk` trials, and the groups alternate chunk by chunk. No session
runs more than SESSION_BLOCKS blocks: the plugin repeats every test once per block, and pytest
holds every repeat in memory from the start of the session. Sessions are planned one at a time.

[Note: resumed blocks] A session that ends inside a block (a test crashed its process or hung)
has recorded the tests before the one in flight, and that test as `crash` or `timeout`; the next
session runs the same block with those tests deselected (Block.done), so the tests after the one
that ended a session still run in every trial.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
import re
from collections.abc import Iterable, Iterator

from racecheck.protocol.schedule import Block

ORDERS = ("alternate", "random")
SESSION_BLOCKS = 500  # the most blocks one session runs [Note: sessions]


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


def blocks(arms, trials, *, seed: int, order: str) -> Iterator[Block]:
    """Every block of `trials` (an iterable of trial indices) x `arms`, in run order, one at a
    time: a run of a million trials is planned as it goes, not before its first trial."""
    return (Block(t, a) for t in trials for a in arm_order(arms, t, seed=seed, order=order))


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
    pending: Iterable[Block],
    *,
    groups: list[tuple[str, ...]],
    isolation: str,
    chunk: int,
    seed: int,
    order: str,
    most: int = SESSION_BLOCKS,
) -> Iterator[SessionPlan]:
    """Split pending blocks (in run order) into sessions, as they are needed; see [Note: sessions].
    No session runs more than `most` blocks (pytest holds every test of every step in memory)."""
    pending = iter(pending)
    if isolation == "process":
        yield from (SessionPlan((b,)) for b in pending)
        return
    if len(groups) <= 1:
        while part := tuple(itertools.islice(pending, most)):
            yield SessionPlan(part)
        return
    # Trial-major order: the blocks of `chunk` trials in a row are a window; each group's part of
    # a window is one session (or more, past `most`), and the groups take turns window by window.
    for _, window in itertools.groupby(enumerate(_by_trial(pending)), key=lambda it: it[0] // chunk):
        trials = [blocks_of_trial for _, blocks_of_trial in window]
        chosen = list(groups)
        if order == "random":
            random.Random(f"racecheck-groups:{seed}:{trials[0][0].trial}").shuffle(chosen)
        for group in chosen:
            theirs = [b for trial in trials for b in trial if b.arm in group]
            for k in range(0, len(theirs), most):
                yield SessionPlan(tuple(theirs[k : k + most]))


def _by_trial(pending: Iterator[Block]) -> Iterator[list[Block]]:
    """The pending blocks trial by trial (they come trial-major)."""
    for _, trial in itertools.groupby(pending, key=lambda b: b.trial):
        yield list(trial)
