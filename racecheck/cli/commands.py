"""The `report`, `gate`, `plan`, `merge`, `list` and `build-native` commands: thin click shells
over the results (tally, report, gate, stats), the run folder's merge, the suites and the
tracker's native log.

Registered on the `racecheck` group by cli/__init__.py. pandas, scipy and matplotlib are imported inside the
command functions only, so `racecheck --help` stays instant. User mistakes (a missing OUT, a log
without records, a rate outside [0, 1], an unknown arm) become click.BadParameter/UsageError: one
line, exit 2. `gate` exits through `ctx.exit` with the code of its decision (exitcodes.py); `merge`
exits 3 while another racecheck process holds its --out, and 130 when interrupted; `build-native`
exits 3 where the native log cannot be built.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TextIO

import click

from racecheck.cli.console import say
from racecheck.cli.params import PROBABILITY, RATE, Folder
from racecheck.exitcodes import ExitCode, InfrastructureError
from racecheck.results.rows import Format


def _load(ctx, out_dir: Path, signature: str | None = None):
    """The records and summary of OUT, or a one-line usage error naming what is wrong."""
    from racecheck.results import tally
    from racecheck.runner.run_folder import open_run_folder

    param = next(p for p in ctx.command.params if p.name == "out_dir")
    try:
        folder = open_run_folder(out_dir, need_run=False)  # the run's plan, where it has run.json
        records = tally.load_records(folder)
    except (FileNotFoundError, ValueError) as exc:
        raise click.BadParameter(str(exc), ctx, param) from None
    for line in records.attrs.get("bad_lines", []):
        say(f"racecheck: warning: {line}")
    try:
        summary = tally.summarize(records, signature=signature)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx, param_hint="--signature") from None
    return records, tally.with_skipped(summary, tally.skipped_suites(folder))


def gate_criteria(*, within: str = ""):
    """The gate's criteria, --max-rate, --min-rate and --confidence, as one decorator shared by
    `gate` and `run --gate`; `within` begins each help text there (e.g. "With --gate: ")."""

    def helped(text: str) -> str:
        return within + text[0].lower() + text[1:] if within else text

    options = (
        click.option(
            "--max-rate",
            type=RATE,
            default=0.0,
            show_default=True,
            help=helped("Highest failure rate allowed for the fixed arm (its upper bound with --confidence)."),
        ),
        click.option(
            "--min-rate",
            type=RATE,
            default=None,
            help=helped(
                "Lowest failure rate required of the baseline (its lower bound with --confidence). "
                "Default: at least one failing trial."
            ),
        ),
        click.option(
            "--confidence",
            type=PROBABILITY,
            default=None,
            help=helped("Judge Wilson bounds at this confidence (e.g. 0.95) instead of observed rates."),
        ),
    )

    def decorate(command):
        for option in reversed(options):
            command = option(command)
        return command

    return decorate


_signature_option = click.option(
    "--signature",
    default=None,
    metavar="REGEX",
    help="Count only failures whose signature or message matches REGEX (e.g. 'AssertionError.*"
    "test_hsdp'); other failures are not evidence of the race and are reported apart.",
)


@click.command("report")
@click.argument("out_dir", metavar="OUT", type=Folder())
@click.option(
    "--format",
    "fmt",
    type=click.Choice([f.value for f in Format]),
    default="terminal",
    show_default=True,
    help="What to render.",
)
@click.option(
    "--output", "-o", type=click.Path(dir_okay=False, path_type=Path), help="Write to FILE instead of stdout."
)
@click.option(
    "--github-summary", is_flag=True, help="Also append the Markdown report to $GITHUB_STEP_SUMMARY (kept under 1 MiB)."
)
@_signature_option
@click.pass_context
def report_command(ctx, out_dir: Path, fmt: str, output: Path | None, github_summary: bool, signature: str | None):
    """Render the trials in OUT (its trials.jsonl): a table, Markdown, CSV, JSON, JUnit or HTML."""
    from racecheck.results import report
    from racecheck.runner.run_location import own_file

    what = own_file(out_dir, output) if output is not None else None
    if what:
        raise click.BadParameter(
            f"{output} is {what}; a report never replaces a run's own files: write it elsewhere",
            ctx,
            param_hint="--output",
        )

    with contextlib.ExitStack() as stack:
        step_summary = stack.enter_context(_step_summary(ctx)) if github_summary else None
        records, summary = _load(ctx, out_dir, signature)
        text = report.render(fmt, summary=summary, records=records)
        if output is None:
            click.echo(text, nl=False)
        else:
            try:
                output.write_text(text, encoding="utf-8")
            except OSError as exc:
                raise click.BadParameter(
                    f"cannot write {output}: {exc.strerror or exc}", ctx, param_hint="--output"
                ) from None
        if step_summary is not None:
            _append_step_summary(step_summary, summary, records)


def _step_summary(ctx) -> TextIO:
    """$GITHUB_STEP_SUMMARY opened for appending, before anything is rendered; a usage error (one
    line, exit 2) where the variable is unset or names no file that can be appended to (a
    folder, a path into a missing folder)."""
    path = os.environ.get("GITHUB_STEP_SUMMARY")
    if not path:
        raise click.UsageError("--github-summary needs $GITHUB_STEP_SUMMARY (GitHub Actions sets it)", ctx)
    try:
        return open(path, "a", encoding="utf-8")
    except OSError as exc:
        raise click.UsageError(
            f"--github-summary: cannot append to $GITHUB_STEP_SUMMARY ({path}): {exc.strerror or exc}", ctx
        ) from None


def _append_step_summary(fh: TextIO, summary, records) -> None:
    """The Markdown report, and the distinct failures when they fit, within the step summary's
    1 MiB, a limit that covers what earlier steps already wrote there."""
    from racecheck.results import failures, render_markdown

    used = os.fstat(fh.fileno()).st_size
    room = max(render_markdown.MARKDOWN_LIMIT - used, 1024)
    after = failures.render_markdown(records)
    after = after if len(after.encode()) < room // 2 else ""
    fh.write(render_markdown.render_markdown(summary, max_bytes=room - len(after.encode())) + after)


@click.command("gate")
@click.argument("out_dir", metavar="OUT", type=Folder())
@click.option("--fixed", required=True, metavar="ARM", help="The arm that must not fail.")
@click.option("--baseline", required=True, metavar="ARM", help="The arm that must still fail.")
@gate_criteria()
@click.option("--scenario", default=None, help="Gate one scenario (default: every scenario that ran both arms).")
@_signature_option
@click.pass_context
def gate_command(ctx, out_dir, fixed, baseline, max_rate, min_rate, confidence, scenario, signature):
    """Pass when the fixed arm's failure rate is low enough AND the baseline still reproduces.

    Exit 0 PASS, 1 FAIL, 4 UNDECIDED (too few trials: the output says how many more would decide).
    """
    from racecheck.results.gate import evaluate_gate

    _, summary = _load(ctx, out_dir, signature)
    arms = list(dict.fromkeys(summary["arm"]))
    for hint, arm in (("--fixed", fixed), ("--baseline", baseline)):
        if arm not in arms:
            raise click.BadParameter(f"unknown arm {arm!r}; arms in {out_dir}: {', '.join(arms)}", ctx, param_hint=hint)
    try:
        result = evaluate_gate(
            summary,
            fixed=fixed,
            baseline=baseline,
            max_rate=max_rate,
            min_rate=min_rate,
            confidence=confidence,
            scenario=scenario,
        )
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx) from None
    click.echo(result.printout())
    ctx.exit(int(result.exit_code))


@click.command("plan")
@click.option("--bound", type=RATE, help="Plan to bound a clean arm's failure rate at or below this rate.")
@click.option(
    "--confidence",
    type=PROBABILITY,
    default=0.95,
    show_default=True,
    help="Confidence of the Wilson bound (with --bound).",
)
@click.option(
    "--baseline-rate",
    type=RATE,
    help="Expected failure rate of the baseline arm (to plan a separation).",
)
@click.option(
    "--fixed-rate",
    type=RATE,
    default=0.0,
    show_default=True,
    help="Expected failure rate of the fixed arm.",
)
@click.option(
    "--alpha",
    type=PROBABILITY,
    default=0.05,
    show_default=True,
    help="Significance level of the one-sided Fisher exact test.",
)
@click.option(
    "--power",
    type=PROBABILITY,
    default=0.9,
    show_default=True,
    help="Required probability that the test separates the arms.",
)
@click.pass_context
def plan_command(ctx, bound, confidence, baseline_rate, fixed_rate, alpha, power):
    """How many trials to run: to bound a clean arm (--bound), or to separate two arms
    (--baseline-rate with --fixed-rate, --alpha, --power)."""
    if (bound is None) == (baseline_rate is None):
        raise click.UsageError("give either --bound, or --baseline-rate (with --fixed-rate)", ctx)
    from racecheck.results import stats

    try:
        if bound is not None:
            n = stats.trials_to_bound(bound, confidence=confidence)
            click.echo(
                f"{n} trials without a failure bound the failure rate at or below "
                f"{stats.format_pct(bound)} at {confidence * 100:g}% (Wilson upper bound; "
                f"{stats.describe_rate(0, n, confidence=confidence)})"
            )
        else:
            n = stats.trials_to_separate(baseline_rate, fixed_rate, alpha=alpha, power=power)
            got = stats.fisher_power(n, baseline_rate, fixed_rate, alpha=alpha)
            click.echo(
                f"{n} trials per arm: a baseline failing at "
                f"{stats.format_pct(baseline_rate)} is told from a fix failing at "
                f"{stats.format_pct(fixed_rate)} by a one-sided "
                f"Fisher exact test at alpha {alpha:g} with power {got:.3f} "
                f"(>= {power:g})"
            )
    except ValueError as exc:
        raise click.UsageError(str(exc), ctx) from None


@click.command("merge")
@click.argument("inputs", nargs=-1, required=True)
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=Folder(file_okay=False),
    help="The folder to write the merged run into.",
)
def merge_command(inputs, out_dir):
    """Join run folders (shards from --shard i/N, other machines, CI jobs) into one run in OUT.

    INPUTS are folders or quoted glob patterns ('shards/*'); a split must be whole (every shard
    of 1/N ... N/N once)."""
    from racecheck.runner import interrupts
    from racecheck.runner.merge import MergeError, expand_inputs, merge
    from racecheck.runner.state import FolderInUse

    with interrupts.handled():  # to the last line: a signal during the summary is an interrupt too
        try:
            inputs = expand_inputs(inputs, out_dir)
            merged = merge(inputs, out_dir)
            for note in merged.notes:
                say(f"racecheck: warning: {note}")
            summarize_run(
                out_dir,
                footer=f"{merged.records} records from {len(inputs)} runs merged into {out_dir} "
                "(trials.jsonl, summary.csv)",
            )
        except MergeError as exc:
            raise click.UsageError(str(exc)) from None
        except FolderInUse as exc:
            raise InfrastructureError(str(exc)) from None
        except KeyboardInterrupt:
            whole = (out_dir / "trials.jsonl").exists()  # the merge's commit point passed
            if whole:
                with interrupts.ignored():
                    summarize_run(out_dir)  # the folder whole: its summary.csv too
            state = "holds the whole merge" if whole else "is unchanged"
            say(f"racecheck: interrupted; {out_dir} {state}")
            raise click.exceptions.Exit(ExitCode.INTERRUPTED) from None


@click.command("list")
@click.option("--scenarios", "scenarios_dir", default=None, help="The catalogue folder (default: ./scenarios).")
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also list the suite of this config (default: ./pyproject.toml's, if any).",
)
def list_command(scenarios_dir, config_file):
    """The catalogue's scenarios (and the project's own suite): arms, expectations, profiles."""
    from racecheck.suites.catalogue import CatalogueError, SuiteKind, find_catalogue, load_catalogue
    from racecheck.suites.project import find_config, load_config

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
        where = f"config {s.config_file}" if s.kind is SuiteKind.PROJECT else f"scenario {s.path.name}/"
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


def summarize_run(out_dir: Path, *, footer: str | None = None, before_table=None) -> bool:
    """Write OUT/summary.csv and, with a footer, print the table and the footer; False when the
    log holds no record. InfrastructureError (exit 3) where summary.csv cannot be written.
    `before_table(records)`, given the records once they are read, runs before the table is
    printed (the run's control trials, whose verdict the failure list then reads)."""
    from racecheck.results import blame, failures, tally
    from racecheck.results.render_terminal import render_terminal
    from racecheck.runner.run_folder import open_run_folder

    try:
        folder = open_run_folder(out_dir, need_run=False)
        records = tally.load_records(folder)
        summary = tally.write_summary(folder, records)
    except (FileNotFoundError, ValueError):
        return False
    except OSError as exc:  # a full or read-only disk: the trials are in trials.jsonl all the same
        raise InfrastructureError(
            f"cannot write {Path(out_dir) / 'summary.csv'}: {exc.strerror or exc}; every trial is kept in "
            f"{Path(out_dir) / 'trials.jsonl'} ('racecheck report {out_dir} --format csv' gives the summary)"
        ) from None
    if before_table is not None:
        before_table(records)
        records.attrs["control"] = blame.controls(out_dir)
    if footer is not None:
        click.echo(render_terminal(summary) + failures.render_terminal(records, logs=f"{out_dir}/logs"))
        click.echo(f"\n{footer}")
    return True


@click.command("build-native")
def build_native_command():
    """Compile the PyTorch tracker's native recording path (op_log.cpp) against this torch now,
    rather than at its first use (an image built for a cluster, a machine that runs offline);
    prints where it is. Exit 3, in one line, where it cannot be built: the tracker then runs its
    Python path, with the same reports."""
    from racecheck.detect import op_log

    try:
        path = op_log.build()
    except op_log.NativeUnavailable as exc:
        raise InfrastructureError(f"{exc}; the tracker runs its Python path here") from None
    click.echo(path)


COMMANDS = (report_command, gate_command, plan_command, merge_command, list_command, build_native_command)
