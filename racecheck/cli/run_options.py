"""`racecheck run`'s options as click options, built from the run's option table
(racecheck/runner/option_table.py), and what the command line does with their values before and after
the run: `--trials auto` worked out, the config built (RunConfig.from_options) with its mistakes
shown as usage errors (one line, exit 2, naming the option), and `--gate`.
"""

from __future__ import annotations

from pathlib import Path

import click

from racecheck import limits
from racecheck.cli.params import SECONDS, Folder, Number
from racecheck.exitcodes import InputError
from racecheck.runner import option_table, options


def _click_type(option: options.RunOption):
    """The click type of a row's `kind` (None: click's own str)."""
    if option.kind == "whole":
        return int if option.least is None else click.IntRange(min=option.least)
    return {
        "file": click.Path(dir_okay=False, path_type=Path),
        "folder": Folder(file_okay=False),
        "seconds": SECONDS,
        "ms": Number(0.0, limits.MAX_DELAY_S * 1e3, within=limits.DELAY_MS_RANGE, metavar="MS"),
        "choice": click.Choice(list(option.choices)),
    }.get(option.kind)


def _callback(option: options.RunOption):
    """A parsed row's click callback: its `parse`, a ValueError shown as a bad value."""
    parse = option.parse
    assert parse is not None, f"{option.flag}: a parsed option needs its parse"
    hint = None if option.quoted_hint else option.flag

    def convert(ctx, param, value):
        if value is None:
            return None
        try:
            return parse(value)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint=hint) from None

    return convert


def _click_option(option: options.RunOption):
    if option.kind == "arguments":
        return click.argument(option.name, nargs=-1, type=click.UNPROCESSED)
    flags = [option.flag, *([option.short] if option.short else []), option.name]
    if option.kind == "flag":
        return click.option(*flags, is_flag=True, help=option.help)
    kwargs: dict = {"default": option.default, "show_default": option.show_default, "help": option.help}
    if option.metavar:
        kwargs["metavar"] = option.metavar
    if option.kind == "parsed":
        kwargs["callback"] = _callback(option)
    return click.option(*flags, type=_click_type(option), **kwargs)


def click_options(command):
    """`command` with every option of the table, the gate's criteria (which `racecheck gate`
    shares) after --baseline, as `racecheck run --help` lists them."""
    from racecheck.cli.commands import gate_criteria

    for option in reversed(option_table.LAST):
        command = _click_option(option)(command)
    command = gate_criteria(within="With --gate: ")(command)
    for option in reversed(option_table.OPTIONS):
        command = _click_option(option)(command)
    return command


def usage_error(exc: InputError) -> click.UsageError:
    """The command line's form of a config's InputError: `Invalid value for --mesh: ...` where it
    names its option, else the message as it is."""
    if exc.option:
        return click.BadParameter(str(exc), param_hint=exc.option)
    return click.UsageError(str(exc))


def config_of(ctx, opts, *, nnodes: int = 1):
    """The RunConfig of the command line (RunConfig.from_options), its mistakes usage errors."""
    from click.core import ParameterSource

    from racecheck.runner.run_config import RunConfig

    given = {name for name in opts if ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE}
    from racecheck.cli.console import say

    warn = lambda line: say(f"racecheck: warning: {line}")  # noqa: E731 - one line, whatever the folder's name
    try:
        return RunConfig.from_options(opts, given=given, nnodes=nnodes, warn=warn)
    except InputError as exc:
        raise usage_error(exc) from None


def trials_value(value):
    """--trials as a number: `auto` worked out (racecheck plan's numbers), said on stderr."""
    if value != "auto":
        return value
    from racecheck.results import stats

    n = stats.trials_for_auto()
    click.echo(
        f"--trials auto: {n} trials per arm (bounds a clean arm at or below "
        f"{stats.AUTO_BOUND:.0%} at {stats.AUTO_CONFIDENCE:.0%}, and separates a "
        f"{stats.AUTO_BASELINE_RATE:.0%} baseline from a clean fix at alpha "
        f"{stats.AUTO_ALPHA:g} with power {stats.AUTO_POWER:g})",
        err=True,
    )
    return n


def gate_options(ctx, opts, config):
    """The gate's settings when --gate is given (checked before the run), else None."""
    from click.core import ParameterSource

    gate_only = ("fixed", "baseline", "max_rate", "min_rate", "confidence")
    if not opts["gate"]:
        given = [n for n in gate_only if ctx.get_parameter_source(n) is ParameterSource.COMMANDLINE]
        if given:
            raise click.UsageError(f"--{given[0].replace('_', '-')} needs --gate")
        return None
    if not opts["fixed"] or not opts["baseline"]:
        raise click.UsageError("--gate needs --fixed ARM and --baseline ARM")
    for hint, arm in (("--fixed", opts["fixed"]), ("--baseline", opts["baseline"])):
        if not any(arm in config.arms_for(s) for s in config.scenarios):
            raise click.BadParameter(f"arm {arm!r} is not one of the run's arms", param_hint=hint)
    if opts["fixed"] == opts["baseline"]:
        raise click.UsageError("--fixed and --baseline name the same arm")
    if opts["confidence"] is not None and opts["max_rate"] <= 0:
        raise click.UsageError("--confidence needs --max-rate above 0: no number of trials bounds a rate at 0")
    return {k: opts[k] for k in gate_only}


def apply_gate(out_dir: Path, gate: dict) -> int:
    from racecheck.results.gate import evaluate_gate
    from racecheck.results.tally import load_records, summarize
    from racecheck.runner.run_folder import open_run_folder

    try:
        result = evaluate_gate(summarize(load_records(open_run_folder(out_dir, need_run=False))), **gate)
    except ValueError as exc:
        raise click.UsageError(f"--gate: {exc}") from None
    click.echo("")
    click.echo(result.printout())
    return int(result.exit_code)
