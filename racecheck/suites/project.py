"""A project's own suite and arms, from `[tool.racecheck]` in pyproject.toml or a `--config` file.

    [tool.racecheck]
    name = "mylib"                 # the suite's name in the log (default: [project] name, else
                                   # the project folder's)
    tests = ["tests/test_io.py"]   # pytest targets (default: pytest's own testpaths); targets
                                   # given after `--` on the command line replace them
    pytest_args = ["-p", "no:randomly"]   # options for every arm
    world_size = 1                 # ranks; more than 1 launches the suite with torchrun
    min_world_size = 1             # the fewest ranks `--world-size` may give it
    perturb = "off"                # default perturbation profile (racecheck.perturb.profiles)
    default_arms = ["old", "new"]  # default: every arm, in file order

    [tool.racecheck.arms.old]
    git = "v1.2.0"                 # run the suite at this revision (a git worktree, reused)
    expect = "race"                # optional: "race" or "safe"
    [tool.racecheck.arms.new]
    env = { MYLIB_LOCKS = "1" }    # environment of the test processes
    pytest_args = ["-k", "not slow"]
    perturb = "rs_delay"           # this arm's perturbation profile

A file given with `--config` holds the same keys under `[tool.racecheck]` or at its top level; the
suite runs in that file's folder unless `root = "..."` (relative to the file) says otherwise.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from racecheck.suites.catalogue import (
    CatalogueError,
    Suite,
    _strings,
    check_default_arms,
    parse_arms,
    reject_unknown_keys,
    world_sizes,
)

SUITE_KEYS = (
    "name",
    "summary",
    "root",
    "tests",
    "pytest_args",
    "world_size",
    "min_world_size",
    "perturb",
    "default_arms",
    "arms",
)


class ConfigError(CatalogueError):
    """The config is missing, unreadable or invalid."""


def find_config(start: Path | None = None) -> Path | None:
    """The nearest pyproject.toml at or above `start` (default: the working folder), if it has a
    `[tool.racecheck]` table; None otherwise (the search stops at the first pyproject.toml).
    ConfigError when that file cannot be read or is not valid TOML: whether it meant to hold a
    suite cannot be told, and running the catalogue instead would hide the mistake."""
    here = Path(start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            data = _read_toml(candidate)
            tool = data.get("tool", {})
            return candidate if isinstance(tool, dict) and "racecheck" in tool else None
    return None


def _read_toml(path: Path) -> dict:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read it: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None


def load_config(path: Path) -> Suite:
    """The suite a config file defines; ConfigError with one line naming what is wrong."""
    path = Path(path)
    data = _read_toml(path)
    table = data.get("tool", {}).get("racecheck")
    where = f"{path} [tool.racecheck]"
    if table is None:
        if path.name == "pyproject.toml" or "arms" not in data:
            raise ConfigError(f"{path}: no [tool.racecheck] table")
        table, where = data, str(path)
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: must be a table")
    reject_unknown_keys(table, SUITE_KEYS, where, ConfigError)
    try:
        arms = parse_arms(table.get("arms"), where)
        default_arms = check_default_arms(table.get("default_arms"), arms, where)
        world, least = world_sizes(table, where)
        tests = _strings(table.get("tests", []), "tests", where)
        pytest_args = _strings(table.get("pytest_args", []), "pytest_args", where)
    except CatalogueError as exc:
        raise ConfigError(str(exc)) from None
    root = (path.parent / table.get("root", ".")).resolve()
    if not root.is_dir():
        raise ConfigError(f"{where}: root {table.get('root')!r} is not a folder")
    perturb = table.get("perturb", "off")
    if not isinstance(perturb, str):
        raise ConfigError(f"{where}: perturb must be a string")
    for key in ("name", "summary"):
        if not isinstance(table.get(key, ""), str):
            raise ConfigError(f"{where}: {key} must be a string")
    suite = Suite(
        name=table.get("name") or _project_name(data) or root.name,
        path=root,
        summary=table.get("summary", ""),
        world_size=world,
        default_perturb=perturb,
        default_arms=default_arms,
        arms=arms,
        root=root,
        tests=tests,
        pytest_args=pytest_args,
        config_file=path.resolve(),
        min_world_size=least,
    )
    try:
        _ = suite.default_profile  # parsed once, here: a bad spec is the file's error
    except ValueError as exc:
        raise ConfigError(f"{where}: perturb: {exc}") from None
    return suite


def _project_name(data: dict) -> str:
    """The `[project] name` of a pyproject.toml, "" where it has none: a suite's name when its
    table gives none, rather than its folder's, which differs between checkouts of one project."""
    project = data.get("project")
    name = project.get("name") if isinstance(project, dict) else None
    return name if isinstance(name, str) else ""


def load_suites(source: dict) -> list[Suite]:
    """The suites a run's `source` names (RunConfig.source, kept in run.json for --resume)."""
    from racecheck.suites.catalogue import load_catalogue, select

    if source.get("kind") == "config":
        return [load_config(Path(source["path"]))]
    if source.get("kind") == "catalogue":
        return select(load_catalogue(Path(source["dir"])), source["names"])
    raise ConfigError(f"unknown suite source {source!r}")
