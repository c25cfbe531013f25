"""The race catalogue: scenario folders under `scenarios/`, each described by `scenario.toml`.

A scenario names its pytest suite (the folder), the process world it needs, its default
perturbation profile and its arms, each arm with `expect = "race"` or `"safe"`.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from pathlib import Path

EXPECTS = ("race", "safe")


class CatalogueError(ValueError):
    """A scenario or arm that does not exist, or a scenario.toml that is invalid."""


@dataclasses.dataclass(frozen=True)
class Arm:
    """One way of running a suite: the buggy code or one of its fixes.

    Scenario arms are selected inside the test process (the `racecheck_arm` fixture), so several
    of them can alternate in one pytest session; `env` and `pytest_args` apply to the process."""

    name: str
    expect: str = ""
    summary: str = ""
    env: tuple[tuple[str, str], ...] = ()
    pytest_args: tuple[str, ...] = ()
    perturb: str | None = None


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str
    path: Path
    summary: str
    world_size: int
    default_perturb: str
    default_arms: tuple[str, ...]
    arms: dict

    def arm(self, name: str) -> Arm:
        try:
            return self.arms[name]
        except KeyError:
            raise CatalogueError(f"unknown arm {name!r} for scenario {self.name!r}; "
                                 f"known: {', '.join(self.arms)}") from None


def find_catalogue(explicit: str | None = None) -> Path:
    """The scenarios folder: --scenarios DIR, $RACECHECK_SCENARIOS, ./scenarios, or the checkout's."""
    candidates = [explicit, os.environ.get("RACECHECK_SCENARIOS"), "scenarios",
                  Path(__file__).resolve().parents[2] / "scenarios"]
    for c in candidates:
        if c and Path(c, ".").is_dir() and any(Path(c).glob("*/scenario.toml")):
            return Path(c).resolve()
    raise CatalogueError("no scenarios folder found: run from the racecheck checkout, "
                         "or pass --scenarios DIR / set RACECHECK_SCENARIOS")


def load_scenario(folder: Path) -> Scenario:
    path = Path(folder) / "scenario.toml"
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise CatalogueError(f"{path}: {exc}") from None
    name = data.get("name", Path(folder).name)
    arms = {}
    for arm_name, spec in data.get("arms", {}).items():
        expect = spec.get("expect", "")
        if expect not in EXPECTS:
            raise CatalogueError(f"{path}: arm {arm_name!r} needs expect = one of {EXPECTS}")
        arms[arm_name] = Arm(arm_name, expect, spec.get("summary", ""),
                             tuple(sorted(spec.get("env", {}).items())), tuple(spec.get("pytest_args", ())),
                             spec.get("perturb"))
    if not arms:
        raise CatalogueError(f"{path}: a scenario needs at least one [arms.NAME] table")
    default_arms = tuple(data.get("default_arms", list(arms)))
    for a in default_arms:
        if a not in arms:
            raise CatalogueError(f"{path}: default arm {a!r} is not defined")
    world = data.get("world_size", 1)
    if not isinstance(world, int) or world < 1:
        raise CatalogueError(f"{path}: world_size must be a positive integer")
    return Scenario(name, Path(folder).resolve(), data.get("summary", ""), world,
                    data.get("default_perturb", "off"), default_arms, arms)


def load_catalogue(root: Path) -> dict[str, Scenario]:
    scenarios = {}
    for toml in sorted(Path(root).glob("*/scenario.toml")):
        s = load_scenario(toml.parent)
        scenarios[s.name] = s
    return scenarios


def select(catalogue: dict[str, Scenario], names: str) -> list[Scenario]:
    """Scenarios named in a comma list, or all of them for `all`."""
    if names == "all":
        return list(catalogue.values())
    chosen = []
    for n in filter(None, (x.strip() for x in names.split(","))):
        if n not in catalogue:
            raise CatalogueError(f"unknown scenario {n!r}; known: {', '.join(catalogue)}")
        chosen.append(catalogue[n])
    if not chosen:
        raise CatalogueError("no scenario named")
    return chosen
