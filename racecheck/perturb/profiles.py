"""Perturbation profiles: which action to take at which injection point, parsed from a short spec.

A spec is a profile name from PROFILES, `off`, or rules joined by commas, each
`ACTION@POINT[:SIZE]`, for example `sleep@before_reduce_scatter:10ms`. Sizes take `us`, `ms`, `s`.
"""

from __future__ import annotations

import dataclasses
import re

from racecheck.perturb.points import POINTS

ACTIONS = ("sleep",)

PROFILES = {
    "off": "",
    # The motivating race: hold the reduce-scatter back so a reuse of its input collides.
    "rs_delay": "sleep@before_reduce_scatter:5ms",
}

_RULE = re.compile(r"^(?P<action>\w+)@(?P<point>\w+)(?::(?P<size>[\d.]+)(?P<unit>us|ms|s))?$")
_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


@dataclasses.dataclass(frozen=True)
class Rule:
    action: str
    point: str
    seconds: float = 0.01


@dataclasses.dataclass(frozen=True)
class Profile:
    name: str
    rules: tuple[Rule, ...]

    @property
    def is_off(self) -> bool:
        return not self.rules

    def to_spec(self) -> str:
        """The explicit rule list, parseable by parse_profile."""
        return ",".join(f"{r.action}@{r.point}:{r.seconds * 1e3:g}ms" for r in self.rules) or "off"

    def with_delay(self, seconds: float) -> "Profile":
        """The same profile with every sleep resized (the CLI's --delay-ms)."""
        rules = tuple(dataclasses.replace(r, seconds=seconds) if r.action == "sleep" else r
                      for r in self.rules)
        return Profile(f"{self.name}:{seconds * 1e3:g}ms", rules)


def parse_profile(spec: str) -> Profile:
    """A Profile from a name or a rule list; ValueError with a one-line reason otherwise."""
    spec = (spec or "off").strip()
    text = PROFILES.get(spec, spec)
    rules = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        m = _RULE.match(part)
        if not m:
            raise ValueError(f"bad perturbation rule {part!r}: expected ACTION@POINT[:SIZE], "
                             f"or one of the profiles {', '.join(PROFILES)}")
        if m["action"] not in ACTIONS:
            raise ValueError(f"unknown perturbation action {m['action']!r}; known: {', '.join(ACTIONS)}")
        if m["point"] not in POINTS:
            raise ValueError(f"unknown injection point {m['point']!r}; known: {', '.join(POINTS)}")
        seconds = float(m["size"]) * _UNITS[m["unit"]] if m["size"] else 0.01
        rules.append(Rule(m["action"], m["point"], seconds))
    return Profile(spec, tuple(rules))
