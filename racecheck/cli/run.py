"""The `run` command: its options, and the run around the trial runner (progress, interrupts,
the table and summary.csv at the end, the perturbation notes, --gate).

The options, declared once in the run's option table (racecheck/runner/option_table.py; their click
form in run_options.py), become values in their callbacks (--perturb a Profile, --mesh a
MeshConfig) and a RunConfig in one place (RunConfig.from_options), so that the command reads as a
script; torch, pandas and the runner's work are imported inside the command, so `racecheck --help`
stays instant.
"""

from __future__ import annotations

import os
import threading
import time

import click

from racecheck.cli import node_options, run_options
from racecheck.cli.commands import summarize_run
from racecheck.cli.console import say
from racecheck.exitcodes import ExitCode, InfrastructureError, InputError, SuiteRejected


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


@click.command("run")
@run_options.click_options
@click.pass_context
def run_command(ctx, **opts):
    """Run a suite under its arms, trial by trial, and tally the failures.

    Arguments after `--` go to pytest (for example a node id to run one test)."""
    from racecheck.runner.command_lines import resume_command
    from racecheck.runner.trial_runner import Runner

    nodes = node_options.node_spec(ctx, opts)  # None on one node; a follower's folder is OUT/nodes/node-R
    opts["trials"] = run_options.trials_value(opts["trials"])
    config = run_options.config_of(ctx, opts, nnodes=nodes.nnodes if nodes is not None else 1)
    gate = run_options.gate_options(ctx, opts, config)

    from racecheck.runner import interrupts
    from racecheck.runner.progress import Progress

    if nodes is not None and not nodes.is_writer:
        node_options.follow(ctx, nodes, config)
        return
    started = time.monotonic()
    for line in describe_worlds(config):
        click.echo(line)
    writer = node_options.writer_for(nodes, config)
    runner = Runner(config, resume=opts["resume_dir"] is not None, nodes=writer)
    progress = Progress(config, counts=runner.counts, enabled=not opts["quiet"])
    runner.listener = progress
    _import_table_libraries_meanwhile()
    with interrupts.handled():  # to the last line: a signal while the table prints is an interrupt too
        try:
            with progress, node_options.hosting(writer):
                try:
                    result = runner.run()
                except SuiteRejected as exc:  # found mid-run (an arm pytest cannot run): the trials before it stay
                    if summarize_run(config.out):
                        raise InputError(f"{exc}; the trials that finished are in {config.out}") from None
                    raise
            _after_run(ctx, config, result, writer=writer, gate=gate, started=started)
        except KeyboardInterrupt:
            with interrupts.ignored():  # a second signal is the same request: summary.csv is written whole
                summarize_run(config.out)
            resume = resume_command(config.out)
            say(f"racecheck: interrupted; finished trials are in {config.out}; continue with: {resume}")
            ctx.exit(ExitCode.INTERRUPTED)


def describe_worlds(config) -> list[str]:
    """One header line per suite: where its ranks run, and why a skipped suite does not."""
    from racecheck.runner.config_build import cuda_devices
    from racecheck.suites.catalogue import SuiteKind

    backend = config.backend if config.backend != "auto" else ("cuda" if cuda_devices("auto") else "cpu")
    lines = []
    for s in config.scenarios:
        world = config.world_for(s)
        mesh = f", mesh {config.mesh_for(s)}" if s.kind is SuiteKind.SCENARIO and world > 1 else ""
        lines.append(f"{s.name}: {world} rank{'s' * (world != 1)}{mesh} on {backend}")
    lines += [f"{name}: skipped, {info['why']}" for name, info in config.skipped.items()]
    return lines


def _after_run(ctx, config, result, *, writer, gate, started: float) -> None:
    """The table and summary.csv, the notes, and the run's exit: the gate's where asked, 3 where a
    node was lost or no test finished."""
    from racecheck.runner.command_lines import resume_command

    if result.stopped == "node lost":
        summarize_run(config.out)
        raise InfrastructureError(
            f"{writer.lost}; the run stopped; finished trials are in {config.out}; "
            f"continue with this on every node: {resume_command(config.out)}"
        )
    have_records = summarize_run(
        config.out,
        footer=f"{config.out}/summary.csv and trials.jsonl written ({time.monotonic() - started:.1f} s)",
        before_table=lambda records: _control_if_needed(config, records),
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


def _control_if_needed(config, records) -> None:
    """Where every arm of a suite failed every trial alike under a perturbation or the detector
    (`records`, the run's as read for its table), one trial of each arm without either
    (runner/control.py), so that the failure list can say whose failure it is (results/blame.py)."""
    from racecheck.results import blame, failures
    from racecheck.runner.control import run_control

    suites = {s for s in failures.suites_failing(records) if blame.instrumented(records, s)}
    if not suites:
        return
    click.echo(
        f"{', '.join(sorted(suites))}: every arm failed every trial alike under racecheck; one control trial "
        f"of each arm without its perturbation and detector ({config.out}/{blame.CONTROL_FOLDER})"
    )
    try:
        run_control(config, suites)
    except Exception as exc:  # noqa: BLE001 - the control informs the verdict; the run's own result stands
        click.echo(f"racecheck: the control could not run ({type(exc).__name__}: {exc}); the verdict cannot tell")


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
