"""Schedules: what to do at each occurrence of an injection point, from a profile and a seed.

A schedule only decides; the injector (or patch mode) acts. Decisions are pure functions of
(profile, seed, rank, point name, occurrence number of that point on this rank), never of wall time
or of how the host interleaves other points, so a failing trial replays from its seed. (One
exception: the random schedule's change points count host steps over all marked points and event
waits together; program order fixes that count on each rank, so a seed still replays.)

[Note: the random schedule]
Exploration for races that no fixed profile targets, in the spirit of PCT (Burckhardt et al.,
"A randomized scheduler with probabilistic guarantees of finding bugs", ASPLOS 2010), with streams
in the place of threads:
- every stream gets a random priority; at each marked point or event wait, with probability
  `sleep`, work on the point's stream is delayed by up to `max`, scaled by how low its priority is,
  so a low-priority stream systematically runs late against the others;
- `depth - 1` change points are drawn among the first `horizon` host steps; at each, the stream of
  that step is demoted below all others: its later work is held behind a gate that opens after a
  few more host steps (a reorder), the PCT priority change;
- every freed block is poisoned with probability `poison` and followed by allocator pressure with
  probability `pressure`, which turns a free-while-in-use into wrong numbers whether or not a real
  reuse happens to collide.
Every action respects the stream semantics a correct program relies on (a delay only stretches a
stream; poison and pressure only touch a block where the program's own next allocation could be
handed it, [Note: sound allocator actions] in free_actions.py), so correct code cannot fail under it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import threading
from collections.abc import Sequence

from racecheck.perturb.points import FREE
from racecheck.perturb.profiles import Profile, RandomConfig


@dataclasses.dataclass(frozen=True)
class Sleep:
    """Enqueue a delay on `stream` (None: the stream of the point)."""

    seconds: float
    stream: str | None = None


@dataclasses.dataclass(frozen=True)
class Hold:
    """Hold `stream`'s later work behind a gate that opens when the host reaches point `until`, or
    after `steps` further host steps, or after `seconds` at the latest."""

    seconds: float
    until: str | None = None
    steps: int | None = None
    stream: str | None = None


@dataclasses.dataclass(frozen=True)
class Poison:
    """Fill the freed block with NaN on its stream, at the program's next allocation there."""


@dataclasses.dataclass(frozen=True)
class Pressure:
    """Allocate the freed block's size on its stream and write it, at the program's next
    allocation there."""


Action = Sleep | Hold | Poison | Pressure
NOTHING: tuple = ()


class Schedule:
    """Decides the actions at each occurrence of a point. `points` is the set of point names that
    can ever get an action (None: any), so a caller can skip the rest without asking."""

    points: frozenset[str] | None = frozenset()

    def actions(self, point: str, *, stream: str) -> Sequence[Action]:
        return NOTHING


class RuleSchedule(Schedule):
    """A fixed profile: the same actions at every occurrence of a point."""

    def __init__(self, profile: Profile) -> None:
        by_point: dict[str, list[Action]] = {}
        for rule in profile.rules:
            by_point.setdefault(rule.point, []).append(_rule_action(rule))
        self._by_point = {p: tuple(a) for p, a in by_point.items()}
        self.points = frozenset(self._by_point)

    def actions(self, point: str, *, stream: str) -> Sequence[Action]:
        return self._by_point.get(point, NOTHING)


def _rule_action(rule) -> Action:
    if rule.action == "sleep":
        return Sleep(rule.seconds, rule.stream)
    if rule.action == "reorder":
        return Hold(rule.seconds, until=rule.until, stream=rule.stream)
    if rule.action == "poison":
        return Poison()
    if rule.action == "pressure":
        return Pressure()
    raise AssertionError(f"unhandled action {rule.action!r}")  # parse_profile rejects the rest


def _rng(*key) -> random.Random:
    """A generator seeded from a stable digest of `key` (independent of PYTHONHASHSEED)."""
    digest = hashlib.blake2b("/".join(map(str, key)).encode(), digest_size=8).digest()
    return random.Random(int.from_bytes(digest, "little"))


class RandomSchedule(Schedule):
    """The seeded random schedule; see [Note: the random schedule]."""

    points = None  # any point may get an action

    HOLD_STEPS = (2, 6)  # a demoted stream is held for this many further host steps (inclusive)

    def __init__(self, config: RandomConfig, *, seed: int, rank: int = 0) -> None:
        self.config = config
        self.seed = seed
        self.rank = rank
        self._lock = threading.RLock()  # frees come from finalizers, on any thread, inside any call
        self._generators: dict[str, random.Random] = {}  # one per point name
        self._priority: dict[str, float] = {}
        self._step = 0
        rng = _rng(seed, rank, "change-points")
        count = min(config.depth - 1, config.horizon)
        self.change_points = frozenset(rng.sample(range(config.horizon), count))

    def priority(self, stream: str) -> float:
        """The stream's random priority in [0, 1): lower runs later."""
        p = self._priority.get(stream)
        if p is None:
            p = self._priority[stream] = _rng(self.seed, self.rank, "priority", stream).random()
        return p

    def _draws(self, point: str) -> random.Random:
        # One generator per point name: the k-th occurrence of a point gets the same draws however
        # other points interleave with it.
        g = self._generators.get(point)
        if g is None:
            g = self._generators[point] = _rng(self.seed, self.rank, "point", point)
        return g

    def actions(self, point: str, *, stream: str) -> Sequence[Action]:
        c = self.config
        with self._lock:
            g = self._draws(point)
            if point == FREE:
                u_poison, u_pressure = g.random(), g.random()
                out: list[Action] = []
                if u_poison < c.poison:
                    out.append(Poison())
                if u_pressure < c.pressure:
                    out.append(Pressure())
                return tuple(out)
            step, self._step = self._step, self._step + 1
            u_sleep, u_size = g.random(), g.random()
            if step in self.change_points:
                steps = _rng(self.seed, self.rank, "hold", step).randint(*self.HOLD_STEPS)
                return (Hold(4 * c.max_delay, steps=steps),)
            if u_sleep < c.sleep:
                scale = 1.0 - self.priority(stream)  # lowest priority: longest delays
                return (Sleep(c.max_delay * (0.1 + 0.9 * scale * u_size)),)
            return NOTHING


def make_schedule(profile: Profile, *, seed: int = 0, rank: int = 0) -> Schedule:
    if profile.systematic is not None:
        raise ValueError(
            "the systematic schedule works in patch mode only (a project's own suite, "
            "racecheck.perturb.patch), on hand-off points the runtime does not mark"
        )
    if profile.random is not None:
        return RandomSchedule(profile.random, seed=seed, rank=rank)
    return RuleSchedule(profile)
