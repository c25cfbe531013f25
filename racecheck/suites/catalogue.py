"""Suites and their arms: the race catalogue (`scenarios/*/scenario.toml`) and the arm definition
that the catalogue and a project's own `[tool.racecheck]` table (project.py) share.

A suite is what the runner runs: pytest targets and options, the process world it needs, a default
perturbation profile and named arms. A catalogue scenario is a suite whose targets are its folder.

Perturbation specs stay as written (`default_perturb`, `Arm.perturb`: what `racecheck list` shows
and the fingerprint keeps) and are parsed once, at load, into the Profile the run uses
(`default_profile`, `Arm.profile`) by perturb/profiles.parse_profile, which imports no torch.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import os
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING

from racecheck.perturb.profiles import parse_profile

if TYPE_CHECKING:
    from racecheck.perturb.profiles import Profile

EXPECTS = ("race", "safe")
ARM_KEYS = ("expect", "summary", "env", "pytest_args", "git", "perturb")


class CatalogueError(ValueError):
    """A scenario or arm that does not exist, or a scenario.toml / config that is invalid."""


@dataclasses.dataclass(frozen=True)
class Arm:
    """One way of running a suite: the buggy code, one of its fixes, or any variant to compare.

    Arms that set none of `env`, `pytest_args` and `git` are told apart inside the test
    process (the `racecheck_arm` fixture), so several of them alternate in one pytest session;
    the others need a process of their own (see `process_key`). `perturb`, when set, overrides the
    run's profile for this arm (it is passed per arm to the plugin, so it needs no process)."""

    name: str
    expect: str = ""  # "race", "safe", or "" (no expectation)
    summary: str = ""
    env: tuple[tuple[str, str], ...] = ()
    pytest_args: tuple[str, ...] = ()
    git: str | None = None  # a revision: the suite runs in a worktree checked out at it
    perturb: str | None = None

    @property
    def process_key(self) -> tuple:
        """Arms with equal keys can share one pytest session."""
        return (self.env, self.pytest_args, self.git)

    @functools.cached_property
    def profile(self) -> Profile | None:
        """The arm's own profile, parsed once (None: the run's or the suite's applies)."""
        return None if self.perturb is None else parse_profile(self.perturb)


class SuiteKind(enum.Enum):
    """What a suite is, which decides how it runs: a catalogue scenario is written on racecheck's
    runtime (the injector perturbs it; its sessions run one thread a rank, rooted at the
    catalogue); a project's own suite uses torch.cuda and torch.distributed directly (patch mode
    perturbs it; it runs in its root as its config says)."""

    SCENARIO = "scenario"
    PROJECT = "project"


@dataclasses.dataclass(frozen=True)
class Suite:
    """A suite: a catalogue scenario, or a project's suite from its `[tool.racecheck]` config."""

    name: str
    path: Path  # the scenario folder, or the project root for a config suite
    summary: str
    world_size: int
    default_perturb: str
    default_arms: tuple[str, ...]
    arms: dict
    root: Path | None = None  # where pytest runs (cwd and rootdir); None: the catalogue's parent
    tests: tuple[str, ...] = ()  # default pytest targets, relative to root (see `targets`)
    pytest_args: tuple[str, ...] = ()  # pytest options for every arm
    config_file: Path | None = None  # the config that defined a config suite (None: catalogue)
    min_world_size: int = 1  # the fewest ranks whose collectives can still show the race
    power_of_two_world: bool = False  # its buffers split evenly only over 1, 2, 4, 8, ... ranks

    def takes_world(self, world: int) -> bool:
        """Whether the scenario runs correctly on `world` ranks (its min_world_size and, where it
        says so, a power of two)."""
        return world >= self.min_world_size and not (self.power_of_two_world and world & (world - 1))

    @property
    def kind(self) -> SuiteKind:
        """The one place that tells a project's suite (it has a config file) from a scenario."""
        return SuiteKind.PROJECT if self.config_file is not None else SuiteKind.SCENARIO

    @functools.cached_property
    def default_profile(self) -> Profile:
        """`default_perturb`, parsed once."""
        return parse_profile(self.default_perturb)

    def unperturbed(self) -> Suite:
        """The suite with no profile anywhere: its default `off`, and no arm's own (a control)."""
        arms = {name: dataclasses.replace(arm, perturb=None) for name, arm in self.arms.items()}
        return dataclasses.replace(self, default_perturb="off", arms=arms)

    @property
    def run_root(self) -> Path:
        return self.root if self.root is not None else self.path.parent.parent

    @property
    def targets(self) -> tuple[str, ...]:
        """Default pytest targets: the scenario folder; a config suite's `tests` (may be empty:
        pytest's own testpaths)."""
        if self.kind is SuiteKind.PROJECT:
            return self.tests
        return self.tests or (os.path.relpath(self.path, self.run_root),)

    def arm(self, name: str) -> Arm:
        try:
            return self.arms[name]
        except KeyError:
            kind = "scenario" if self.kind is SuiteKind.SCENARIO else "suite"
            raise CatalogueError(
                f"unknown arm {name!r} for {kind} {self.name!r}; known: {', '.join(self.arms)}"
            ) from None


def _strings(value, what: str, where: str) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise CatalogueError(f"{where}: {what} must be a list of strings")
    return tuple(value)


def reject_unknown_keys(table: dict, known, where: str, error: type[CatalogueError] = CatalogueError) -> None:
    """`error` with a one-line reason naming the keys of `table` that are not in `known`."""
    unknown = sorted(set(table) - set(known))
    if unknown:
        raise error(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(known)}")


def parse_arm(name: str, spec, where: str) -> Arm:
    """An Arm from its TOML table; CatalogueError with a one-line reason when it is invalid."""
    where = f"{where}: arm {name!r}"
    if not isinstance(spec, dict):
        raise CatalogueError(f"{where} must be a table")
    reject_unknown_keys(spec, ARM_KEYS, where)
    expect = spec.get("expect", "")
    if expect not in ("",) + EXPECTS:
        raise CatalogueError(f"{where}: expect must be one of {', '.join(EXPECTS)}")
    env = _environment(spec.get("env", {}), where)
    for key in ("git", "perturb", "summary"):
        if not isinstance(spec.get(key, ""), str) or (key != "summary" and spec.get(key) == ""):
            raise CatalogueError(f"{where}: {key} must be a non-empty string")
    arm = Arm(
        name,
        expect,
        spec.get("summary", ""),
        env,
        _strings(spec.get("pytest_args", []), "pytest_args", where),
        spec.get("git"),
        spec.get("perturb"),
    )
    try:
        _ = arm.profile  # parsed once, here: a bad spec is the file's error
    except ValueError as exc:
        raise CatalogueError(f"{where}: {exc}") from None
    return arm


def _environment(env, where: str) -> tuple[tuple[str, str], ...]:
    """An arm's `env` table as sorted (NAME, value) pairs; CatalogueError for one that no process
    environment can hold: a name that is empty or holds `=` or NUL, a value that holds NUL."""
    if not isinstance(env, dict) or not all(isinstance(v, (str, int, float, bool)) for v in env.values()):
        raise CatalogueError(f'{where}: env must be a table of NAME = "value"')
    pairs = tuple(sorted((k, str(v).lower() if isinstance(v, bool) else str(v)) for k, v in env.items()))
    for name, value in pairs:
        if not name or "=" in name or "\0" in name:
            raise CatalogueError(f"{where}: env: {name!r} is no variable name (it is empty, or holds '=' or NUL)")
        if "\0" in value:
            raise CatalogueError(f"{where}: env: the value of {name} holds NUL, which no environment takes")
    return pairs


def check_arm_name(name: str, where: str) -> None:
    """CatalogueError unless the command line can name the arm back: `--arms` splits at commas
    and strips spaces (and reads `all` as every arm), `--stop-when` ends an arm at `:`, and a
    replay line must print it. So an arm's name is printable, without spaces, commas or colons,
    and not `all`."""
    if not name or name == "all" or not name.isprintable() or any(c.isspace() or c in ",:" for c in name):
        raise CatalogueError(
            f"{where}: arm name {name!r} cannot be given on the command line: an arm's name is printable, "
            "without spaces, commas or colons, and not 'all'"
        )


def parse_arms(table, where: str) -> dict[str, Arm]:
    if not isinstance(table, dict) or not table:
        raise CatalogueError(f"{where}: needs at least one [arms.NAME] table")
    for name in table:
        check_arm_name(name, where)
    return {name: parse_arm(name, spec, where) for name, spec in table.items()}


def check_default_arms(value, arms: dict, where: str) -> tuple[str, ...]:
    default = _strings(value, "default_arms", where) if value is not None else tuple(arms)
    if not default:
        raise CatalogueError(f"{where}: default_arms is empty; name at least one arm, or leave it out for every arm")
    for a in default:
        if a not in arms:
            raise CatalogueError(f"{where}: default arm {a!r} is not defined")
    return default


def _flag(table: dict, key: str, where: str) -> bool:
    value = table.get(key, False)
    if not isinstance(value, bool):
        raise CatalogueError(f"{where}: {key} must be true or false")
    return value


def check_world_size(value, where: str, key: str = "world_size") -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise CatalogueError(f"{where}: {key} must be a positive integer")
    return value


def world_sizes(table: dict, where: str) -> tuple[int, int]:
    """(world_size, min_world_size) of a suite's table: the ranks it is written for, and the fewest
    that can still show its race (`--world-size` below it is refused)."""
    world = check_world_size(table.get("world_size", 1), where)
    least = check_world_size(table.get("min_world_size", 1), where, "min_world_size")
    if least > world:
        raise CatalogueError(f"{where}: min_world_size {least} is larger than world_size {world}")
    return world, least


def find_catalogue(explicit: str | None = None) -> Path:
    """The scenarios folder: --scenarios DIR, $RACECHECK_SCENARIOS, ./scenarios, or the checkout's."""
    candidates = [
        explicit,
        os.environ.get("RACECHECK_SCENARIOS"),
        "scenarios",
        Path(__file__).resolve().parents[2] / "scenarios",
    ]
    if explicit and not any(Path(explicit).glob("*/scenario.toml")):
        raise CatalogueError(f"{explicit}: no scenario folders (*/scenario.toml) there")
    for c in candidates:
        if c and Path(c, ".").is_dir() and any(Path(c).glob("*/scenario.toml")):
            return Path(c).resolve()
    raise CatalogueError(
        "no scenarios folder found: run from the racecheck checkout, or pass --scenarios DIR / set RACECHECK_SCENARIOS"
    )


def load_scenario(folder: Path) -> Suite:
    path = Path(folder) / "scenario.toml"
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise CatalogueError(f"{path}: {exc}") from None
    name = data.get("name", Path(folder).name)
    arms = parse_arms(data.get("arms"), str(path))
    default_arms = check_default_arms(data.get("default_arms"), arms, str(path))
    world, least = world_sizes(data, str(path))
    for key in ("name", "summary", "default_perturb"):
        if not isinstance(data.get(key, ""), str):
            raise CatalogueError(f"{path}: {key} must be a string")
    suite = Suite(
        name,
        Path(folder).resolve(),
        data.get("summary", ""),
        world,
        data.get("default_perturb", "off"),
        default_arms,
        arms,
        min_world_size=least,
        power_of_two_world=_flag(data, "power_of_two_world", str(path)),
    )
    try:
        _ = suite.default_profile  # parsed once, here: a bad spec is the file's error
    except ValueError as exc:
        raise CatalogueError(f"{path}: default_perturb: {exc}") from None
    return suite


def load_catalogue(root: Path) -> dict[str, Suite]:
    scenarios = {}
    for toml in sorted(Path(root).glob("*/scenario.toml")):
        s = load_scenario(toml.parent)
        scenarios[s.name] = s
    return scenarios


def select(catalogue: dict[str, Suite], names: str) -> list[Suite]:
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
