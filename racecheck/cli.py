"""The `racecheck` command line: a click group whose commands are thin shells over the library.

Heavy imports (torch, pandas) happen inside commands so that `racecheck --help` is instant.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from racecheck.exitcodes import ExitCode, InfrastructureError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="racecheck")
def cli() -> None:
    """Make stream/allocator races happen on demand, prove fixes, and gate CI on the evidence."""


def _register_analysis_commands() -> None:
    from racecheck.trials.cli_commands import COMMANDS

    for command in COMMANDS:
        cli.add_command(command)


def main() -> None:
    """Console entry point: maps racecheck's own errors to the documented exit codes."""
    try:
        rc = cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("racecheck: aborted", err=True)
        sys.exit(130)
    except click.UsageError as exc:
        # One line, no traceback: usage mistakes exit 2 as click's own convention does.
        hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx else ""
        click.echo(f"racecheck: error: {exc.format_message()}{hint}", err=True)
        sys.exit(ExitCode.USAGE)
    except click.ClickException as exc:
        click.echo(f"racecheck: error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except InfrastructureError as exc:
        click.echo(f"racecheck: infrastructure error: {exc}", err=True)
        sys.exit(ExitCode.INFRASTRUCTURE)
    sys.exit(rc if isinstance(rc, int) else ExitCode.OK)


def _parse_trials(ctx, param, value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a whole number") from None
    if n < 1:
        raise click.BadParameter("must be at least 1")
    return n


@cli.command("run", context_settings={"ignore_unknown_options": False})
@click.option("--scenario", "scenario_names", default="main_grad_reuse", show_default=True,
              help="Scenario name(s), comma separated, or 'all' (then every arm of each scenario).")
@click.option("--arms", default=None, help="Arms to alternate, comma separated (default: the scenario's).")
@click.option("--trials", default="10", show_default=True, callback=_parse_trials,
              help="Trials per arm.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Output folder for trials.jsonl and summary.csv (default: racecheck-out/run-TIME).")
@click.option("--perturb", default=None, help="Perturbation profile or rules (default: the scenario's).")
@click.option("--no-perturb", is_flag=True, help="Run without perturbation: the natural failure rate.")
@click.option("--delay-ms", type=click.FloatRange(min=0), default=None,
              help="Resize every sleep of the profile to this many milliseconds.")
@click.option("--seed", type=int, default=0, show_default=True, help="Base seed; trial t uses seed+t.")
@click.option("--isolation", type=click.Choice(["session", "process"]), default="session", show_default=True,
              help="session: all trials in one process world (fast); process: a fresh world per trial.")
@click.option("--timeout", type=click.FloatRange(min=1), default=300, show_default=True,
              help="Seconds without a finished test before the trial counts as hung and is killed.")
@click.option("--backend", type=click.Choice(["auto", "sim", "cuda"]), default="auto", show_default=True,
              help="Stream runtime: the CPU emulation, CUDA, or CUDA when a GPU is present.")
@click.option("--detect", is_flag=True, help="Run the happens-before detector in every trial.")
@click.option("--scenarios", "scenarios_dir", default=None, help="The catalogue folder (default: ./scenarios).")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@click.argument("pytest_args", nargs=-1, type=click.UNPROCESSED)
def run_command(scenario_names, arms, trials, out_dir, perturb, no_perturb, delay_ms, seed, isolation,
                timeout, backend, detect, scenarios_dir, quiet, pytest_args):
    """Run scenario suites under their arms, trial by trial, and tally the failures.

    Arguments after `--` go to pytest (for example a node id to run one test)."""
    from racecheck.trials.catalogue import CatalogueError, find_catalogue, load_catalogue, select
    from racecheck.perturb.profiles import parse_profile

    if perturb and no_perturb:
        raise click.UsageError("--perturb and --no-perturb exclude each other")
    try:
        catalogue = load_catalogue(find_catalogue(scenarios_dir))
        chosen = select(catalogue, scenario_names)
        arm_list = tuple(a.strip() for a in arms.split(",") if a.strip()) if arms else None
        if arms is not None and not arm_list:
            raise click.BadParameter("no arm named", param_hint="--arms")
        for s in chosen:
            for a in arm_list or ():
                s.arm(a)
    except CatalogueError as exc:
        raise click.UsageError(str(exc)) from None
    spec = "off" if no_perturb else perturb
    if spec is not None or delay_ms is not None:
        try:
            specs = {s.name: parse_profile(spec if spec is not None else s.default_perturb) for s in chosen}
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--perturb") from None
        if delay_ms is not None:
            if len({p.to_spec() for p in specs.values()}) > 1:
                raise click.UsageError("--delay-ms needs --perturb when the scenarios' profiles differ")
            spec = next(iter(specs.values())).with_delay(delay_ms / 1e3).to_spec()
    if out_dir is None:
        out_dir = Path("racecheck-out") / time.strftime("run-%Y%m%d-%H%M%S")
    if (out_dir / "trials.jsonl").exists():
        raise click.UsageError(f"{out_dir} already holds a run; choose another --out")

    from racecheck.trials.progress import Progress
    from racecheck.trials.runner import RunConfig, Runner

    config = RunConfig(scenarios=tuple(chosen), arms=arm_list, trials=trials, out=out_dir, perturb=spec,
                       seed=seed, isolation=isolation, timeout=timeout, backend=backend, detect=detect,
                       pytest_args=tuple(pytest_args), all_arms=scenario_names == "all")
    started = time.monotonic()
    with Progress(config, enabled=not quiet) as progress:
        runner = Runner(config, on_record=progress.record, on_expected=progress.expect)
        runner.run()
    _finish(out_dir, elapsed=time.monotonic() - started)


def _finish(out_dir: Path, *, elapsed: float) -> None:
    from racecheck.trials.report import render_terminal
    from racecheck.trials.tally import load_records, summarize, write_summary

    write_summary(out_dir)
    click.echo(render_terminal(summarize(load_records(out_dir))))
    click.echo(f"\n{out_dir}/summary.csv and trials.jsonl written ({elapsed:.1f} s)")


_register_analysis_commands()
