"""Perturbation profiles: which action to take at which injection point, parsed from a short spec.

A spec is one of
- a profile name from PROFILES (`rs_delay`, `poison`, ...) or `off`;
- rules and profile names joined by commas (`enter_delay,pressure`), each rule
  `ACTION@POINT[>UNTIL][:SIZE][/STREAM]`:
    sleep@before_reduce_scatter:5ms      a 5 ms delay on the stream current at the point
    sleep@free:2ms/reduce_scatter        a delay on the named stream instead
    reorder@before_all_reduce>end_of_backward:20ms
                                         hold the stream's later work until the host reaches
                                         end_of_backward (at most 20 ms)
    poison@free                          fill each freed block with NaN on its allocation stream
    pressure@free                        a same-size allocation written on that stream
                                         (both at the program's next allocation on that stream,
                                         while the block is still free there: free_actions.py)
  Sizes take `us`, `ms`, `s` (`1.5ms`, `2e-3s`), at most an hour (racecheck.limits); a sleep
  without a size lasts 10 ms, a hold at most 50 ms.
- the random schedule, `random[:KEY=VALUE]...`, with keys max (largest delay), sleep, poison and
  pressure (probabilities per point or free), depth (PCT depth: 1 + the number of priority change
  points) and horizon (steps over which change points are drawn), e.g. `random:max=2ms:depth=4`.
- the systematic schedule of patch mode, `systematic[:delay=SIZE][:pairs=0|1][:at=KEY[+KEY]]`:
  trial 0 records the hand-off points a test passes, trial t >= 1 delays the t-th of them alone by
  `delay` (default 5 ms), then, with pairs=1 (the default), every pair once the singles are done
  (racecheck.perturb.systematic). `at=` (last, it takes the rest of the spec) names the points to
  delay directly, as a failing trial's record does (`stream_enter@train.py:42/s1`): the replay.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from racecheck import limits
from racecheck.perturb.points import COLLECTIVE_AFTER_POINTS, COLLECTIVE_POINTS, FREE, HANDOFF_POINTS, POINTS

# The points the systematic schedule enumerates: every place where work passes between streams,
# on both sides of the call.
SYSTEMATIC_POINTS = (*HANDOFF_POINTS, *COLLECTIVE_POINTS.values(), *COLLECTIVE_AFTER_POINTS.values())

# The points patch mode acts at, in code that is not racecheck's (racecheck.perturb.patch).
PATCH_POINTS = (
    frozenset(COLLECTIVE_POINTS.values()) | frozenset(COLLECTIVE_AFTER_POINTS.values()) | frozenset(HANDOFF_POINTS)
) | {FREE}

ACTIONS = ("sleep", "reorder", "poison", "pressure")
FREE_ONLY_ACTIONS = ("poison", "pressure")  # they act on a freed block

PROFILES = {
    "off": "",
    # The motivating race: hold the reduce-scatter back so a reuse of its input collides.
    "rs_delay": "sleep@before_reduce_scatter:5ms",
    # The motivating race's collision, made whatever the timing of the copy-in or the allocator's
    # choice of block: the reduce-scatter waits 5 ms before it reads A; A's block is poisoned at its
    # free, so a read of it is wrong even when the next allocation takes another block of that size
    # (the allocator hands out the lowest equal free block: about 2% of the frees here); and the
    # default stream lags 2 ms once the reduce-scatter is enqueued, so the next buffer's zero fill,
    # when it does land in A's block, comes after the reduce-scatter stream's copy-in into A. On the
    # CPU emulation the default stream runs on the host, so that lag is a host sleep in which the
    # copy-in runs, as it does on a GPU ahead of a lagging default stream; without it a late copy-in
    # adds the gradient into the fresh zeros and hides the reuse.
    "rs_window": "sleep@after_reduce_scatter:2ms/default,sleep@before_reduce_scatter:5ms,poison@free",
    # HSDP: hold the all-reduce back while the next group's reduce-scatter runs.
    "ar_delay": "sleep@before_all_reduce:5ms",
    # Delay the consumer of all-gathered parameters (compute) right after its wait.
    "compute_delay": "sleep@wait_all_gather:3ms",
    # Delay an offload copy on its copy stream.
    "copy_delay": "sleep@before_copy:3ms",
    # Delay a gradient's producer stream, so a consumer that waited on the wrong stream reads early.
    "grad_delay": "sleep@before_grad:3ms",
    # Delay the consumer of a host-to-device copy right after its wait (NO_SHARD CPU offload).
    "h2d_consumer_delay": "sleep@wait_copy:3ms",
    # Patch mode's hand-off points (a project's own suite): hold back the work after the host
    # entered a side stream, after a stream was made to wait, or the work an event marks.
    "enter_delay": "sleep@stream_enter:5ms",
    "wait_delay": "sleep@stream_wait:5ms",
    "before_wait_delay": "sleep@before_stream_wait:5ms",
    "record_delay": "sleep@event_record:5ms",
    # Hold back the work after a record, which the event does not cover (an event recorded early).
    "after_record_delay": "sleep@after_event_record:5ms",
    "poison": "poison@free",
    "pressure": "pressure@free",
    "random": "random",
    "systematic": "systematic",
}

DEFAULT_SLEEP_S = 0.01
DEFAULT_HOLD_S = 0.05

# What float() takes, without signs, nan or inf: the spelling _format_seconds writes, exponents too.
_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?"
_RULE = re.compile(
    rf"^(?P<action>\w+)@(?P<point>\w+)(?:>(?P<until>\w+))?"
    rf"(?::(?P<size>{_NUMBER})(?P<unit>us|ms|s))?(?:/(?P<stream>[\w.-]+))?$"
)
_SIZE = re.compile(rf"^(?P<size>{_NUMBER})(?P<unit>us|ms|s)$")
_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
DEFAULT_SYSTEMATIC_DELAY_S = 0.005
# A hand-off point's key: POINT@FILE:LINE/STREAM (racecheck.perturb.systematic.handoff_key)
HANDOFF_KEY = re.compile(r"^(?P<point>\w+)@(?P<where>[^+]+:\d+)/(?P<stream>[\w.-]+)$")


@dataclasses.dataclass(frozen=True)
class Rule:
    action: str
    point: str
    seconds: float = DEFAULT_SLEEP_S  # sleep: the delay; reorder: the longest hold
    until: str | None = None  # reorder: the point at which the gate opens
    stream: str | None = None  # the stream acted on, by name (default: see module docstring)

    def to_spec(self) -> str:
        text = f"{self.action}@{self.point}"
        if self.until:
            text += f">{self.until}"
        if self.action in ("sleep", "reorder"):
            text += f":{_format_seconds(self.seconds)}"
        if self.stream:
            text += f"/{self.stream}"
        return text


@dataclasses.dataclass(frozen=True)
class RandomConfig:
    """The seeded random schedule (see racecheck.perturb.decisions.RandomSchedule)."""

    max_delay: float = 0.004
    sleep: float = 0.25  # probability of a delay at a marked point or event wait
    poison: float = 0.25  # probability of poisoning a freed block
    pressure: float = 0.25  # probability of allocator pressure after a free
    depth: int = 3  # PCT depth d: d - 1 priority change points (stream holds)
    horizon: int = 64  # change points are drawn among the first `horizon` steps

    def to_spec(self) -> str:
        default = RandomConfig()
        parts = ["random"]
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value != getattr(default, f.name):
                key = "max" if f.name == "max_delay" else f.name
                parts.append(f"{key}={_format_seconds(value) if key == 'max' else value}")
        return ":".join(parts)


@dataclasses.dataclass(frozen=True)
class SystematicConfig:
    """The systematic schedule (see racecheck.perturb.systematic)."""

    delay: float = DEFAULT_SYSTEMATIC_DELAY_S
    pairs: bool = True  # pairs of points once every single point had its trial
    at: tuple[str, ...] = ()  # hand-off keys to delay in every trial (a replay); () = enumerate

    def to_spec(self) -> str:
        parts = ["systematic"]
        if self.delay != DEFAULT_SYSTEMATIC_DELAY_S:
            parts.append(f"delay={_format_seconds(self.delay)}")
        if not self.pairs:
            parts.append("pairs=0")
        if self.at:
            parts.append("at=" + "+".join(self.at))
        return ":".join(parts)


@dataclasses.dataclass(frozen=True)
class Profile:
    """What a spec says: its rules, or its random or systematic schedule. `name` is the spec as it
    was written (`rs_delay`); two profiles that say the same are equal whatever their spelling."""

    name: str = dataclasses.field(compare=False)
    rules: tuple[Rule, ...] = ()
    random: RandomConfig | None = None
    systematic: SystematicConfig | None = None

    @property
    def is_off(self) -> bool:
        return not self.rules and self.random is None and self.systematic is None

    def to_spec(self) -> str:
        """The explicit form, parseable by parse_profile."""
        if self.random is not None:
            return self.random.to_spec()
        if self.systematic is not None:
            return self.systematic.to_spec()
        return ",".join(r.to_spec() for r in self.rules) or "off"

    def with_delay(self, seconds: float) -> Profile:
        """The same profile with every sleep resized (the CLI's --delay-ms); for the random
        schedule, the largest delay."""
        if self.random is not None:
            return Profile(
                f"{self.name}:{seconds * 1e3:g}ms", random=dataclasses.replace(self.random, max_delay=seconds)
            )
        if self.systematic is not None:
            return Profile(
                f"{self.name}:{seconds * 1e3:g}ms", systematic=dataclasses.replace(self.systematic, delay=seconds)
            )
        rules = tuple(dataclasses.replace(r, seconds=seconds) if r.action == "sleep" else r for r in self.rules)
        return Profile(f"{self.name}:{seconds * 1e3:g}ms", rules)


def parse_profile(spec: str) -> Profile:
    """A Profile from a name, a rule list, a random or systematic spec; ValueError with a one-line
    reason. The one parser of spec text: where it enters the runner's process (a suite's file, the
    command line, run.json) and once per spec in a rank (the plugin, from the session's schedule).
    Parsing imports no torch."""
    if not isinstance(spec, str):
        raise ValueError(f"{spec!r} is not a profile")
    if not spec.strip():
        raise ValueError(f"{spec!r} is no profile; write 'off' for none")
    spec = spec.strip()
    text = PROFILES.get(spec, spec)
    if text == "random" or text.startswith("random:"):
        return Profile(spec, random=_parse_random(text))
    if text == "systematic" or text.startswith("systematic:"):
        return Profile(spec, systematic=_parse_systematic(text))
    if text and not _parts(text):
        raise ValueError(f"{spec!r} names no perturbation rule; write 'off' for none")
    rules: list[Rule] = []
    for part in _parts(text):
        named = PROFILES.get(part)
        if named is None:
            rules.append(_parse_rule(part))
        elif named.partition(":")[0] in ("random", "systematic"):
            raise ValueError(f"{part!r} is a schedule of its own: it cannot be joined with other rules in {spec!r}")
        else:  # a named profile joined with others: its rules in its place
            rules.extend(_parse_rule(p) for p in _parts(named))
    return Profile(spec, tuple(dict.fromkeys(rules)))  # a rule named twice acts once


def check_where(profile: Profile, *, patch_mode: bool) -> None:
    """ValueError (one line) unless `profile` can be carried out where it runs: in patch mode (a
    project's own suite), sleeps at patch mode's points and poison@free or pressure@free, on no
    named stream; on racecheck's runtime (the catalogue's scenarios), anything but the systematic
    schedule and the hand-off points, which only patch mode has. The one check of both sides: the
    runner's before a run (runner/config_checks.py), a rank's before its tests and PatchMode's."""
    if not patch_mode:
        if profile.systematic is not None or any(r.point in HANDOFF_POINTS for r in profile.rules):
            raise ValueError(
                f"{profile.to_spec()}: the systematic schedule and the hand-off points "
                f"({', '.join(HANDOFF_POINTS)}) act in patch mode, on a project's own suite"
            )
        return
    bad = [
        r.to_spec()
        for r in profile.rules
        if r.stream
        or not (
            (r.action == "sleep" and r.point in PATCH_POINTS - {FREE})
            or (r.action in FREE_ONLY_ACTIONS and r.point == FREE)
        )
    ]
    if bad:
        raise ValueError(
            f"patch mode takes sleep@{{{','.join(sorted(PATCH_POINTS - {FREE}))}}} and "
            f"pressure@free / poison@free rules only, not {', '.join(bad)}"
        )


def _parts(text: str) -> list[str]:
    return [p for p in (p.strip() for p in text.split(",")) if p]


def _parse_rule(part: str) -> Rule:
    m = _RULE.match(part)
    if not m:
        raise ValueError(
            f"bad perturbation rule {part!r}: expected ACTION@POINT[>UNTIL][:SIZE][/STREAM], "
            f"or one of the profiles {', '.join(PROFILES)}"
        )
    action, point, until = m["action"], m["point"], m["until"]
    if action not in ACTIONS:
        raise ValueError(f"unknown perturbation action {action!r}; known: {', '.join(ACTIONS)}")
    for p in filter(None, (point, until)):
        if p not in POINTS:
            raise ValueError(f"unknown injection point {p!r}; known: {', '.join(POINTS)}")
    if action in FREE_ONLY_ACTIONS and point != FREE:
        raise ValueError(f"{action} acts on a freed block: write {action}@{FREE}")
    if until and action != "reorder":
        raise ValueError(f"'>{until}' (a gate's opening point) belongs to reorder rules only")
    if action == "reorder" and not until:
        raise ValueError(f"reorder needs the point that opens its gate: reorder@{point}>POINT")
    if action in FREE_ONLY_ACTIONS and m["stream"]:
        raise ValueError(f"{action} always acts on the freed block's own stream; drop the /STREAM")
    default = DEFAULT_HOLD_S if action == "reorder" else DEFAULT_SLEEP_S
    seconds = _delay(m["size"], m["unit"], part) if m["size"] else default
    return Rule(action, point, seconds, until, m["stream"])


def _parse_random(text: str) -> RandomConfig:
    values: dict[str, Any] = {}  # max_delay and the probabilities (float), depth, horizon (int)
    for item in text.split(":")[1:]:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"bad random schedule option {item!r}: expected KEY=VALUE")
        if key not in ("max", "sleep", "poison", "pressure", "depth", "horizon"):
            raise ValueError(
                f"unknown random schedule option {key!r}; known: max, sleep, poison, pressure, depth, horizon"
            )
        bad = ValueError(f"bad value {value!r} for random schedule option {key!r}")
        if key == "max":
            m = _SIZE.match(value)
            if not m:
                raise bad
            values["max_delay"] = _delay(m["size"], m["unit"], "random schedule option 'max'")
            continue
        try:
            number = float(value) if key in ("sleep", "poison", "pressure") else int(value)
        except ValueError:
            raise bad from None
        if not (0.0 <= number <= 1.0 if isinstance(number, float) else number >= 1):  # nan too
            raise bad
        values[key] = number
    return RandomConfig(**values)


def _parse_systematic(text: str) -> SystematicConfig:
    rest = text[len("systematic") :]
    at: tuple[str, ...] = ()
    head, sep, keys = rest.partition(":at=")
    if sep:
        at = tuple(keys.split("+"))
        for key in at:
            m = HANDOFF_KEY.match(key)
            if not m:
                raise ValueError(f"bad hand-off point {key!r} in systematic at=: expected POINT@FILE:LINE/STREAM")
            if m["point"] not in SYSTEMATIC_POINTS:
                raise ValueError(f"unknown hand-off point {m['point']!r}; known: {', '.join(SYSTEMATIC_POINTS)}")
    values: dict = {}
    for item in filter(None, head.split(":")):
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"bad systematic schedule option {item!r}: expected KEY=VALUE")
        if key == "delay":
            m = _SIZE.match(value)
            if not m:
                raise ValueError(f"bad value {value!r} for systematic schedule option 'delay': expected e.g. 5ms")
            values["delay"] = _delay(m["size"], m["unit"], "systematic schedule option 'delay'")
        elif key == "pairs":
            if value not in ("0", "1"):
                raise ValueError(f"bad value {value!r} for systematic schedule option 'pairs': expected 0 or 1")
            values["pairs"] = value == "1"
        else:
            raise ValueError(f"unknown systematic schedule option {key!r}; known: delay, pairs, at")
    return SystematicConfig(at=at, **values)


def _delay(size: str, unit: str, where: str) -> float:
    """The seconds of a size in a spec (`5`, `ms`); ValueError past racecheck's longest delay."""
    seconds = float(size) * _UNITS[unit]
    if not limits.is_delay(seconds):
        raise ValueError(f"{where}: {size}{unit} is longer than an hour, the longest delay racecheck takes")
    return seconds


def _format_seconds(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:g}s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:g}ms"
    return f"{seconds * 1e6:g}us"
