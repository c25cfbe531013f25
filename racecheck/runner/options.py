"""What an option of `racecheck run` is (RunOption, a row of option_table.py) and how its value
reads: from the command line's text (`parse`, for a row of kind `parsed`) and from run.json
(read_back, checked as the command line checks it), and how a replay command spells it (`text`).

A row says what its value is without click: `kind` (text, flag, whole, seconds, ms, choice, file,
folder, arguments, or parsed by `parse`, which raises ValueError with a one-line reason); the
command line turns each kind into its click type (cli/run_options.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from racecheck import limits

if TYPE_CHECKING:
    from racecheck.perturb.profiles import Profile
    from racecheck.protocol.mesh import MeshConfig
    from racecheck.runner.blocks import Shard
    from racecheck.runner.stopping import StopRule


@dataclasses.dataclass(frozen=True)
class RunOption:
    """One option of `racecheck run` (see the module docstring)."""

    flag: str  # `--seed`; an argument's name in capitals (PYTEST_ARGS)
    name: str  # its value's name: the click parameter, and RunConfig's field where `field`
    help: str
    kind: str = "text"
    default: Any = None
    metavar: str | None = None
    choices: tuple[str, ...] = ()  # kind choice
    least: int | None = None  # kind whole: its least value (None: any)
    parse: Callable[[str], Any] | None = None  # kind parsed: the value of its text
    read: Callable[[Any], Any] | None = None  # run.json's value of a kept setting (else by kind)
    short: str = ""  # a one-letter flag too (-q)
    field: bool = False  # RunConfig's field of its name takes the value as it is
    defining: bool = False  # run.json keeps what it decided: not given with --resume
    kept: bool = False  # run.json keeps RunConfig's field of its name (read back by read_back)
    quoted_hint: bool = True  # its errors name it as click does ('--mesh'); False: as the config's checks do

    @property
    def show_default(self) -> bool:
        """Whether `--help` shows the default: where there is one to show."""
        return self.default is not None and self.default != ""

    def text(self, value: Any) -> list[str]:
        """The arguments that give `value` again (a replay command's)."""
        if self.kind == "flag":
            return [self.flag] if value else []
        return [self.flag, str(value.to_spec() if hasattr(value, "to_spec") else value)]


def trials_of(text: str) -> int | str:
    if text == "auto":
        return text  # the command line works it out (results.stats), which the runner cannot
    try:
        n = int(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a whole number or 'auto'") from None
    if n < 1:
        raise ValueError("must be at least 1")
    return n


# The parsers import their modules when first called, so that `racecheck --help` imports none.
def shard_of(text: Any) -> Shard:
    from racecheck.runner.blocks import Shard

    return Shard.parse(str(text))


def job_shard_of(text: str) -> Shard | str:
    return text if text == "auto" else shard_of(text)  # auto: from the job's environment (shard_env.py)


def profile_of(text: Any) -> Profile:
    from racecheck.perturb.profiles import parse_profile

    return parse_profile(text)


def rules_of(text: str) -> tuple[StopRule, ...]:
    from racecheck.runner.stopping import parse_rules

    return parse_rules(text)


def read_mesh(value: Any) -> MeshConfig:
    """The MeshConfig of `SHARDxREPLICATE` text given to the runner (`--mesh`, run.json);
    ValueError with a one-line reason. The ranks rebuild the mesh from its two integers
    (MeshConfig.from_env)."""
    from racecheck.protocol.mesh import MeshConfig

    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not of the form SHARDxREPLICATE")
    return MeshConfig.parse(value)


def whole(least: int | None) -> Callable[[Any], int]:
    def read(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{value!r} is not a whole number")
        if least is not None and value < least:
            raise ValueError(f"{value} is below {least}")
        return value

    return read


def _seconds(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not limits.is_seconds(value):
        raise ValueError(f"{value!r} is not {limits.SECONDS_RANGE}")
    return float(value)


def read_flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{value!r} is not true or false")
    return value


def strings(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{str(value)[:40]!r} is not a list of strings")
    return tuple(value)


def _one_of(choices: tuple[str, ...]) -> Callable[[Any], str]:
    def read(value: Any) -> str:
        if value not in choices:
            raise ValueError(f"{value!r} is not one of {', '.join(choices)}")
        return value

    return read


def optional(read: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda value: None if value is None else read(value)


def read_back(option: RunOption) -> Callable[[Any], Any]:
    """How run.json's value of a kept setting reads back, checked as the command line checks it."""
    if option.read is not None:
        return option.read
    by_kind = {"flag": read_flag, "seconds": _seconds, "whole": whole(option.least), "choice": _one_of(option.choices)}
    read = by_kind[option.kind]
    return optional(read) if option.default is None else read
