"""The `racecheck` command line: a click group whose commands are thin shells over the library.

Heavy imports (torch, pandas) happen inside commands so that `racecheck --help` is instant.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from racecheck.exitcodes import ExitCode, InfrastructureError, InputError
from racecheck.trials import node_options, run_options
from racecheck.trials.cli_commands import COMMANDS, check_rate


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="racecheck")
def cli() -> None:
    """Make stream/allocator races happen on demand, prove fixes, and gate CI on the evidence."""


def main() -> None:
    """Console entry point: maps racecheck's own errors to the documented exit codes."""
    try:
        rc = cli.main(prog_name="racecheck", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("racecheck: aborted", err=True)
        sys.exit(ExitCode.INTERRUPTED)
    except click.UsageError as exc:
        # One line, no traceback: usage mistakes exit 2 as click's own convention does.
        hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx else ""
        click.echo(f"racecheck: error: {exc.format_message()}{hint}", err=True)
        sys.exit(ExitCode.USAGE)
    except click.ClickException as exc:
        click.echo(f"racecheck: error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except InputError as exc:
        click.echo(f"racecheck: error: {exc}", err=True)
        sys.exit(ExitCode.USAGE)
    except InfrastructureError as exc:
        click.echo(f"racecheck: infrastructure error: {exc}", err=True)
        sys.exit(ExitCode.INFRASTRUCTURE)
    sys.exit(rc if isinstance(rc, int) else ExitCode.OK)


def _parse_trials(ctx, param, value):
    if value is None or value == "auto":
        return value
    try:
        n = int(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a whole number or 'auto'") from None
    if n < 1:
        raise click.BadParameter("must be at least 1")
    return n


def _parse_mesh(ctx, param, value):
    if value is None:
        return None
    from racecheck.mesh_config import MeshConfig

    try:
        return str(MeshConfig.parse(value))
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _parse_shard(ctx, param, value):
    from racecheck.trials.schedule import Shard

    if value is None or value == "auto":
        return value  # auto: resolved from the job's environment (shard_env.py)
    try:
        return Shard.parse(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _parse_stop(ctx, param, value):
    if value is None:
        return ()
    from racecheck.trials.stopping import parse_rules

    try:
        return parse_rules(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@cli.command("run")
@click.option("--scenario", "scenario_names", default=None,
              help="Catalogue scenario(s), comma separated, or 'all' (then every arm of each). "
                   "Default: the suite of ./pyproject.toml's [tool.racecheck], else main_grad_reuse.")
@click.option("--config", "config_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Run the suite and arms of this TOML file ([tool.racecheck] or top-level keys).")
@click.option("--arms", default=None,
              help="Arms to run, comma separated, or 'all' (default: the suite's; every arm with --scenario all).")
@click.option("--trials", default=None, callback=_parse_trials, metavar="N|auto",
              help="Trials per arm [default: 10; on --resume, the run's]; 'auto' = enough to bound a "
                   "clean arm and separate the arms (racecheck plan).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Output folder for trials.jsonl and summary.csv (default: racecheck-out/run-TIME).")
@click.option("--resume", "resume_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Continue the run in this folder up to --trials (its settings come from run.json).")
@click.option("--perturb", default=None, help="Perturbation profile or rules (default: the suite's; "
                                              "an arm's own profile wins).")
@click.option("--no-perturb", is_flag=True, help="Run without perturbation: the natural failure rate.")
@click.option("--delay-ms", type=click.FloatRange(min=0), default=None,
              help="Resize every sleep of the profile to this many milliseconds.")
@click.option("--seed", type=int, default=0, show_default=True, help="Base seed; trial t uses seed+t.")
@click.option("--isolation", type=click.Choice(["session", "process"]), default="session", show_default=True,
              help="session: many trials per process world (fast, trials share state); "
                   "process: a fresh world per trial (independent, pays start-up every trial).")
@click.option("--order", type=click.Choice(["alternate", "random"]), default="alternate", show_default=True,
              help="Arms inside each trial: in the given order (A B A B) or a seeded permutation.")
@click.option("--chunk", type=click.IntRange(min=1), default=5, show_default=True,
              help="session isolation, arms that need their own process (env, pytest args, git): "
                   "trials per session; the arms' sessions alternate chunk by chunk.")
@click.option("--shard", default=None, callback=_parse_shard, metavar="i/N|auto",
              help="Run slice i of N of the trials (merge the slices with 'racecheck merge'); 'auto': "
                   "from the job's environment (RACECHECK_SHARD=i/N, or a Slurm array's task).")
@click.option("--timeout", type=click.FloatRange(min=1), default=300, show_default=True,
              help="Seconds without a test starting or finishing before the trial counts as hung "
                   "and its process tree is killed; the run goes on (start-up gets at least 120 s).")
@click.option("--max-time", type=click.FloatRange(min=1), default=None, metavar="SECONDS",
              help="Stop at the next trial boundary after this long.")
@click.option("--stop-when", "stop_rules", default=None, callback=_parse_stop, metavar="RULES",
              help="Stop a suite once all rules hold, e.g. 'baseline:failures>=3,fixed:clean>=20'.")
@click.option("--backend", type=click.Choice(["auto", "sim", "cuda"]), default="auto", show_default=True,
              help="Stream runtime: the CPU emulation, CUDA, or CUDA when a GPU is present.")
@click.option("--world-size", type=click.IntRange(min=1), default=None,
              help="Ranks per session (default: the suite's world_size).")
@click.option("--mesh", default=None, callback=_parse_mesh, metavar="SHARDxREPLICATE",
              help="The HSDP mesh of the scenarios that take theirs from the run (main_grad_reuse), "
                   "e.g. 4x2; its size must be the world size (default: 2 x world/2 for an even "
                   "world above 2, else every rank a shard).")
@click.option("--nnodes", type=click.IntRange(min=1), default=1, show_default=True,
              help="Nodes the world spans; every node runs this same command (see docs/cluster.md).")
@click.option("--node-rank", type=click.IntRange(min=0), default=0, show_default=True,
              help="This node's rank; node 0 writes the run folder and hosts the rendezvous.")
@click.option("--rdzv-endpoint", default=None, metavar="HOST:PORT",
              help="With --nnodes: node 0's address for torchrun's c10d rendezvous.")
@click.option("--rdzv-backend", type=click.Choice(["c10d"]), default="c10d", show_default=True,
              help="torchrun's rendezvous backend (racecheck's node 0 hosts its store).")
@click.option("--rdzv-id", default="racecheck", show_default=True,
              help="torchrun's rendezvous id (the same on every node); each session adds its own suffix.")
@click.option("--rdzv-conf", default="", metavar="K=V,...",
              help="torchrun's rendezvous settings, passed through (join_timeout, keep_alive_interval, ...).")
@click.option("--detect", is_flag=True, help="Run the happens-before detector in every trial.")
@click.option("--scenarios", "scenarios_dir", default=None, help="The catalogue folder (default: ./scenarios).")
@click.option("--gate", is_flag=True, help="After the run, apply the gate (see 'racecheck gate') and "
                                           "exit with its code: 0 pass, 1 fail, 4 undecided.")
@click.option("--fixed", default=None, metavar="ARM", help="With --gate: the arm that must not fail.")
@click.option("--baseline", default=None, metavar="ARM", help="With --gate: the arm that must still fail.")
@click.option("--max-rate", type=float, default=0.0, show_default=True, callback=check_rate,
              help="With --gate: highest failure rate allowed for the fixed arm.")
@click.option("--min-rate", type=float, default=None, callback=check_rate,
              help="With --gate: lowest failure rate required of the baseline.")
@click.option("--confidence", type=float, default=None, callback=check_rate,
              help="With --gate: judge Wilson bounds at this confidence.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@click.argument("pytest_args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def run_command(ctx, **opts):
    """Run a suite under its arms, trial by trial, and tally the failures.

    Arguments after `--` go to pytest (for example a node id to run one test)."""
    from racecheck.trials.runner import Runner

    nodes = node_options.node_spec(ctx, opts)  # None on one node; a follower's folder is OUT/nodes/node-R
    if opts["resume_dir"] is not None:
        config = run_options.resumed_config(ctx, opts)
    else:
        config = run_options.fresh_config(ctx, opts)
    node_options.check_nodes(config, nodes)
    gate = run_options.gate_options(ctx, opts, config)

    from racecheck.trials import interrupts
    from racecheck.trials.progress import Progress

    if nodes is not None and not nodes.is_writer:
        node_options.follow(ctx, nodes, config)
        return
    started = time.monotonic()
    for line in run_options.describe_worlds(config):
        click.echo(line)
    writer = node_options.writer_for(nodes, config)
    runner = Runner(config, resume=opts["resume_dir"] is not None, nodes=writer)
    progress = Progress(config, counts=runner.counts, enabled=not opts["quiet"])
    runner.listener = progress
    try:
        with interrupts.handled(), progress, node_options.hosting(writer):
            result = runner.run()
    except KeyboardInterrupt:
        _summarize(config.out)
        click.echo(f"racecheck: interrupted; finished trials are in {config.out}; continue with "
                   f"'racecheck run --resume {config.out}'", err=True)
        ctx.exit(ExitCode.INTERRUPTED)
    if result.stopped == "node lost":
        _summarize(config.out)
        raise InfrastructureError(f"{writer.lost}; the run stopped; finished trials are in {config.out}; "
                                  f"continue with 'racecheck run --resume {config.out}' on every node")
    have_records = _summarize(config.out, footer=f"{config.out}/summary.csv and trials.jsonl written "
                                                 f"({time.monotonic() - started:.1f} s)")
    _perturbation_notes(config.out)
    if result.stopped:
        why = "--max-time was reached" if result.stopped == "max-time" else "the stop rules held"
        click.echo(f"stopped early: {why}; 'racecheck run --resume {config.out}' continues")
    if not have_records:
        raise InfrastructureError(f"no test finished (stopped: {result.stopped or 'no'}); see {config.out}/logs")
    if gate is not None:
        ctx.exit(run_options.apply_gate(config.out, gate))


def _perturbation_notes(out_dir: Path) -> None:
    """What the perturbation did: profiles that never acted, the systematic schedule's bound."""
    from racecheck.trials.perturb_notes import perturbation_notes
    from racecheck.trials.record import read_log

    try:
        records = list(read_log(out_dir / "trials.jsonl"))
    except (OSError, ValueError):
        return
    for line in perturbation_notes(records):
        click.echo(line)


def _summarize(out_dir: Path, *, footer: str | None = None) -> bool:
    """Write OUT/summary.csv and, with a footer, print the table and the footer; False when the
    log holds no record."""
    from racecheck.trials.report import render_terminal
    from racecheck.trials.tally import load_records, skipped_suites, summarize, summary_to_csv, with_skipped

    try:
        summary = with_skipped(summarize(load_records(out_dir)), skipped_suites(out_dir))
    except (FileNotFoundError, ValueError):
        return False
    summary_to_csv(summary, out_dir / "summary.csv")
    if footer is not None:
        click.echo(render_terminal(summary))
        click.echo(f"\n{footer}")
    return True


@cli.command("merge")
@click.argument("inputs", nargs=-1, required=True)
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="The folder to write the merged run into.")
def merge_command(inputs, out_dir):
    """Join run folders (shards from --shard i/N, other machines, CI jobs) into one run in OUT.

    INPUTS are folders or quoted glob patterns ('shards/*'); a split must be whole (every shard
    of 1/N ... N/N once)."""
    from racecheck.trials.merge import MergeError, expand_inputs, merge

    try:
        inputs = expand_inputs(inputs, out_dir)
        n = merge(inputs, out_dir)
    except MergeError as exc:
        raise click.UsageError(str(exc)) from None
    _summarize(out_dir, footer=f"{n} records from {len(inputs)} runs merged into {out_dir} "
                               f"(trials.jsonl, summary.csv)")


@cli.command("list")
@click.option("--scenarios", "scenarios_dir", default=None, help="The catalogue folder (default: ./scenarios).")
@click.option("--config", "config_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also list the suite of this config (default: ./pyproject.toml's, if any).")
def list_command(scenarios_dir, config_file):
    """The catalogue's scenarios (and the project's own suite): arms, expectations, profiles."""
    from racecheck.trials.catalogue import CatalogueError, find_catalogue, load_catalogue
    from racecheck.trials.config import find_config, load_config

    suites = []
    try:
        config_file = config_file or find_config()
        if config_file is not None:
            suites.append(load_config(config_file))
        try:
            suites += load_catalogue(find_catalogue(scenarios_dir)).values()
        except CatalogueError:
            if scenarios_dir or not suites:
                raise
    except CatalogueError as exc:
        raise click.UsageError(str(exc)) from None
    for s in suites:
        where = f"config {s.config_file}" if s.config_file else f"scenario {s.path.name}/"
        least = f", at least {s.min_world_size}" if 1 < s.min_world_size < s.world_size else ""
        click.echo(f"{s.name}  ({where}; world size {s.world_size}{least}; default perturb {s.default_perturb})")
        if s.summary:
            click.echo(f"  {s.summary}")
        width = max(len(a) for a in s.arms) + 1
        for name, arm in s.arms.items():
            mark = "*" if name in s.default_arms else " "
            extra = [f"git {arm.git}"] if arm.git else []
            extra += [f"env {' '.join(f'{k}={v}' for k, v in arm.env)}"] if arm.env else []
            extra += [f"pytest {' '.join(arm.pytest_args)}"] if arm.pytest_args else []
            extra += [f"perturb {arm.perturb}"] if arm.perturb else []
            text = "; ".join(([arm.summary] if arm.summary else []) + extra)
            click.echo(f"  {mark}{name:<{width}} {arm.expect or '-':<5} {text}".rstrip())
        click.echo("")
    click.echo("* default arm; expect: race (must reproduce) / safe (must stay clean)")


for _command in COMMANDS:  # report, gate, plan
    cli.add_command(_command)
