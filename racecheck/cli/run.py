"""The `run` command: its options, and the run around the trial runner (progress, interrupts,
the table and summary.csv at the end, the perturbation notes, --gate).

The options become values in their callbacks (--perturb a Profile, --mesh a MeshConfig) and a
RunConfig in run_options.py and node_options.py, whose settings the config checks itself
(RunConfig.validate, through run_checks.py), so that the command reads as a script; torch, pandas
and the runner are imported inside the command, so `racecheck --help` stays instant.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import click

from racecheck import limits
from racecheck.cli import node_options, run_checks, run_options
from racecheck.cli.commands import gate_criteria, summarize_run
from racecheck.cli.params import Folder, Number
from racecheck.exitcodes import ExitCode, InfrastructureError

SECONDS = Number(limits.MIN_SECONDS, limits.MAX_SECONDS, within=limits.SECONDS_RANGE, metavar="SECONDS")


def _import_table_libraries_meanwhile() -> None:
    """Import pandas and scipy.stats (about 2 s of CPU), which the table at the end needs, on a
    daemon thread at the lowest priority while the trials run: the ranks keep the cores, and the
    table follows the last trial without that wait. A failure here is left to the import that
    needs the module, which reports it."""

    def load() -> None:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)  # on Linux, this thread only
        except (AttributeError, OSError):
            pass
        try:
            import pandas  # noqa: F401
            import scipy.stats  # noqa: F401
        except Exception:  # the import that needs the module reports it
            pass

    threading.Thread(target=load, name="racecheck-table-imports", daemon=True).start()


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
    from racecheck.runner.run_config import read_mesh

    try:
        return read_mesh(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _parse_perturb(ctx, param, value):
    """--perturb's Profile: the spec is parsed here, once, and travels as the value."""
    if value is None:
        return None
    from racecheck.perturb.profiles import parse_profile

    try:
        return parse_profile(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--perturb") from None


def _parse_shard(ctx, param, value):
    from racecheck.runner.blocks import Shard

    if value is None or value == "auto":
        return value  # auto: resolved from the job's environment (runner/shard_env.py)
    try:
        return Shard.parse(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _parse_stop(ctx, param, value):
    if value is None:
        return ()
    from racecheck.runner.stopping import parse_rules

    try:
        return parse_rules(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@click.command("run")
@click.option(
    "--scenario",
    "scenario_names",
    default=None,
    help="Catalogue scenario(s), comma separated, or 'all' (then every arm of each). "
    "Default: the suite of ./pyproject.toml's [tool.racecheck], else main_grad_reuse.",
)
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Run the suite and arms of this TOML file ([tool.racecheck] or top-level keys).",
)
@click.option(
    "--arms",
    default=None,
    help="Arms to run, comma separated, or 'all' (default: the suite's; every arm with --scenario all).",
)
@click.option(
    "--trials",
    default=None,
    callback=_parse_trials,
    metavar="N|auto",
    help="Trials per arm [default: 10; on --resume, the run's]; 'auto' = enough to bound a "
    "clean arm and separate the arms (racecheck plan).",
)
@click.option(
    "--out",
    "out_dir",
    type=Folder(file_okay=False),
    default=None,
    help="Output folder for trials.jsonl and summary.csv (default: a new racecheck-out/run-TIME in "
    "the project's root, the config file's folder; for the catalogue, in the current folder).",
)
@click.option(
    "--resume",
    "resume_dir",
    type=Folder(file_okay=False),
    default=None,
    help="Continue the run in this folder up to --trials (its settings come from run.json).",
)
@click.option(
    "--allow-changed-suite",
    is_flag=True,
    help="With --resume: continue although the suite's tests or definition changed since the run "
    "started (the tally then mixes trials of both); without it such a resume is refused.",
)
@click.option(
    "--perturb",
    default=None,
    callback=_parse_perturb,
    help="Perturbation profile or rules (default: the suite's; an arm's own profile wins).",
)
@click.option("--no-perturb", is_flag=True, help="Run without perturbation: the natural failure rate.")
@click.option(
    "--delay-ms",
    type=Number(0.0, limits.MAX_DELAY_S * 1e3, within=limits.DELAY_MS_RANGE, metavar="MS"),
    default=None,
    help="Resize every sleep of the profile to this many milliseconds (at most an hour).",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Base seed; trial t uses seed+t.")
@click.option(
    "--isolation",
    type=click.Choice(["session", "process"]),
    default="session",
    show_default=True,
    help="session: many trials per process world (fast, trials share state); "
    "process: a fresh world per trial (independent, pays start-up every trial).",
)
@click.option(
    "--order",
    type=click.Choice(["alternate", "random"]),
    default="alternate",
    show_default=True,
    help="Arms inside each trial: in the given order (A B A B) or a seeded permutation.",
)
@click.option(
    "--chunk",
    type=click.IntRange(min=1),
    default=5,
    show_default=True,
    help="session isolation, arms that need their own process (env, pytest args, git): "
    "trials per session; the arms' sessions alternate chunk by chunk.",
)
@click.option(
    "--shard",
    default=None,
    callback=_parse_shard,
    metavar="i/N|auto",
    help="Run slice i of N of the trials (merge the slices with 'racecheck merge'); 'auto': "
    "from the job's environment (RACECHECK_SHARD=i/N, or a Slurm array's task).",
)
@click.option(
    "--timeout",
    type=SECONDS,
    default=300,
    show_default=True,
    help="Seconds without a test starting or finishing before the trial counts as hung "
    "and its process tree is killed; the run goes on (start-up gets at least 120 s; 1 s to a week).",
)
@click.option(
    "--max-time",
    type=SECONDS,
    default=None,
    help="Stop at the next trial boundary after this long (1 s to a week).",
)
@click.option(
    "--stop-when",
    "stop_rules",
    default=None,
    callback=_parse_stop,
    metavar="RULES",
    help="Stop a suite once all rules hold, e.g. 'baseline:failures>=3,fixed:clean>=20'.",
)
@click.option(
    "--backend",
    type=click.Choice(["auto", "sim", "cuda"]),
    default="auto",
    show_default=True,
    help="Stream runtime: the CPU emulation, CUDA, or CUDA when a GPU is present.",
)
@click.option(
    "--world-size",
    type=click.IntRange(min=1),
    default=None,
    help="Ranks per session (default: the suite's world_size).",
)
@click.option(
    "--mesh",
    default=None,
    callback=_parse_mesh,
    metavar="SHARDxREPLICATE",
    help="The HSDP mesh of the scenarios that take theirs from the run (main_grad_reuse), "
    "e.g. 4x2; its size must be the world size (default: 2 x world/2 for an even "
    "world above 2, else every rank a shard).",
)
@click.option(
    "--nnodes",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Nodes the world spans; every node runs this same command (see docs/cluster.md).",
)
@click.option(
    "--node-rank",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="This node's rank; node 0 writes the run folder and hosts the rendezvous.",
)
@click.option(
    "--rdzv-endpoint",
    default=None,
    metavar="HOST:PORT",
    help="With --nnodes: node 0's address for torchrun's c10d rendezvous.",
)
@click.option(
    "--rdzv-backend",
    type=click.Choice(["c10d"]),
    default="c10d",
    show_default=True,
    help="torchrun's rendezvous backend (racecheck's node 0 hosts its store).",
)
@click.option(
    "--rdzv-id",
    default="racecheck",
    show_default=True,
    help="torchrun's rendezvous id (the same on every node); each session adds its own suffix.",
)
@click.option(
    "--rdzv-conf",
    default="",
    metavar="K=V,...",
    help="torchrun's rendezvous settings, passed through (join_timeout, keep_alive_interval, ...).",
)
@click.option("--detect", is_flag=True, help="Run the happens-before detector in every trial.")
@click.option("--scenarios", "scenarios_dir", default=None, help="The catalogue folder (default: ./scenarios).")
@click.option(
    "--gate",
    is_flag=True,
    help="After the run, apply the gate (see 'racecheck gate') and exit with its code: 0 pass, 1 fail, 4 undecided.",
)
@click.option("--fixed", default=None, metavar="ARM", help="With --gate: the arm that must not fail.")
@click.option("--baseline", default=None, metavar="ARM", help="With --gate: the arm that must still fail.")
@gate_criteria(within="With --gate: ")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@click.argument("pytest_args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def run_command(ctx, **opts):
    """Run a suite under its arms, trial by trial, and tally the failures.

    Arguments after `--` go to pytest (for example a node id to run one test)."""
    from racecheck.runner.run_config import resume_command
    from racecheck.runner.trial_runner import Runner

    nodes = node_options.node_spec(ctx, opts)  # None on one node; a follower's folder is OUT/nodes/node-R
    nnodes = nodes.nnodes if nodes is not None else 1
    if opts["resume_dir"] is not None:
        config = run_options.resumed_config(ctx, opts, nnodes=nnodes)
    else:
        config = run_options.fresh_config(ctx, opts, nnodes=nnodes)
    gate = run_options.gate_options(ctx, opts, config)

    from racecheck.runner import interrupts
    from racecheck.runner.progress import Progress

    if nodes is not None and not nodes.is_writer:
        node_options.follow(ctx, nodes, config)
        return
    started = time.monotonic()
    for line in run_checks.describe_worlds(config):
        click.echo(line)
    writer = node_options.writer_for(nodes, config)
    runner = Runner(config, resume=opts["resume_dir"] is not None, nodes=writer)
    progress = Progress(config, counts=runner.counts, enabled=not opts["quiet"])
    runner.listener = progress
    _import_table_libraries_meanwhile()
    with interrupts.handled():  # to the last line: a signal while the table prints is an interrupt too
        try:
            with progress, node_options.hosting(writer):
                result = runner.run()
            _after_run(ctx, config, result, writer=writer, gate=gate, started=started)
        except KeyboardInterrupt:
            with interrupts.ignored():  # a second signal is the same request: summary.csv is written whole
                summarize_run(config.out)
            click.echo(
                f"racecheck: interrupted; finished trials are in {config.out}; "
                f"continue with: {resume_command(config.out)}",
                err=True,
            )
            ctx.exit(ExitCode.INTERRUPTED)


def _after_run(ctx, config, result, *, writer, gate, started: float) -> None:
    """The table and summary.csv, the notes, and the run's exit: the gate's where asked, 3 where a
    node was lost or no test finished."""
    from racecheck.runner.run_config import resume_command

    if result.stopped == "node lost":
        summarize_run(config.out)
        raise InfrastructureError(
            f"{writer.lost}; the run stopped; finished trials are in {config.out}; "
            f"continue with this on every node: {resume_command(config.out)}"
        )
    have_records = summarize_run(
        config.out, footer=f"{config.out}/summary.csv and trials.jsonl written ({time.monotonic() - started:.1f} s)"
    )
    _perturbation_notes(config)
    if result.stopped:
        why = "--max-time was reached" if result.stopped == "max-time" else "the stop rules held"
        click.echo(f"stopped early: {why}; continue with: {resume_command(config.out)}")
    if not have_records and not config.shard.trials(config.trials):
        click.echo(
            f"shard {config.shard}: nothing to run ({config.trials} trial(s) split {config.shard.count} ways "
            f"leave this shard none); {config.out} holds its empty part for 'racecheck merge'"
        )
        return
    if not have_records:
        raise InfrastructureError(f"no test finished (stopped: {result.stopped or 'no'}); see {config.out}/logs")
    if gate is not None:
        ctx.exit(run_options.apply_gate(config.out, gate))


def _perturbation_notes(config) -> None:
    """What the perturbation did (profiles that never acted, the systematic schedule's bound) and
    what the detector could not see."""
    from racecheck.results.detector_notes import detector_notes
    from racecheck.results.perturb_notes import perturbation_notes
    from racecheck.runner.trial_log import read_log

    try:
        records = list(read_log(config.out / "trials.jsonl"))
    except (OSError, ValueError):
        return
    profiles = {(s.name, a): config.profile_for(s, a) for s in config.scenarios for a in config.arms_for(s)}
    for line in perturbation_notes(records, profiles):
        click.echo(line)
    for line in detector_notes(records):
        click.echo(line)
