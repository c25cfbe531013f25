"""Turning `racecheck run`'s options into a RunConfig (fresh, or from OUT/run.json with --resume),
and its --gate: the run command's logic, kept out of run.py so that the command reads as a script.

User mistakes become click.UsageError/BadParameter (one line, exit 2); git and suite problems found
later raise exitcodes.InputError (exit 2) as well. The settings' own checks are the config's
(RunConfig.validate), run through run_checks.checked.
"""

from __future__ import annotations

import os
from pathlib import Path

import click

from racecheck.cli import run_checks
from racecheck.exitcodes import InputError
from racecheck.perturb.profiles import Profile

# Options that define the experiment: on --resume they come from OUT/run.json.
_DEFINING = (
    "scenario_names",
    "config_file",
    "arms",
    "out_dir",
    "perturb",
    "no_perturb",
    "delay_ms",
    "seed",
    "isolation",
    "order",
    "chunk",
    "backend",
    "world_size",
    "mesh",
    "detect",
    "scenarios_dir",
    "shard",
    "pytest_args",
)


def suites_from_options(opts) -> tuple[list, dict]:
    """The suites to run and their source (kept in run.json for --resume)."""
    from racecheck.suites.catalogue import CatalogueError, find_catalogue, load_catalogue, select
    from racecheck.suites.project import find_config, load_config

    names, config_file = opts["scenario_names"], opts["config_file"]
    if names is not None and config_file is not None:
        raise click.UsageError("--scenario and --config exclude each other")
    try:
        if names is None:
            config_file = config_file or find_config()
        if config_file is not None:
            suite = load_config(config_file)
            return [suite], {"kind": "config", "path": str(suite.config_file)}
        folder = find_catalogue(opts["scenarios_dir"])
        names = names or "main_grad_reuse"
        return select(load_catalogue(folder), names), {"kind": "catalogue", "dir": str(folder), "names": names}
    except CatalogueError as exc:
        raise click.UsageError(str(exc)) from None


def fresh_config(ctx, opts, *, nnodes: int = 1):
    """The RunConfig the command line describes (checked for `nnodes` nodes, git revisions
    resolved)."""
    from racecheck.runner.run_config import RunConfig
    from racecheck.suites.catalogue import CatalogueError

    suites, source = suites_from_options(opts)
    all_arms = opts["scenario_names"] == "all" or opts["arms"] == "all"
    arm_list = None
    if opts["arms"] is not None and opts["arms"] != "all":
        arm_list = tuple(dict.fromkeys(a.strip() for a in opts["arms"].split(",") if a.strip()))
        if not arm_list:
            raise click.BadParameter("no arm named", param_hint="--arms")
    try:
        for s in suites:
            for a in arm_list or ():
                s.arm(a)
    except CatalogueError as exc:
        raise click.UsageError(str(exc)) from None
    if opts["allow_changed_suite"]:
        raise click.UsageError("--allow-changed-suite needs --resume")
    if opts["perturb"] is not None and opts["no_perturb"]:
        raise click.UsageError("--perturb and --no-perturb exclude each other")
    shard, shard_source = job_shard(opts["shard"])
    from racecheck.runner.run_location import default_parent, run_name

    # The default is named here and made at the end, once the options are known to be good.
    out_dir = opts["out_dir"] or default_parent(suites[0].config_file) / run_name()
    config = RunConfig(
        scenarios=tuple(suites),
        arms=arm_list,
        trials=trials_value(opts["trials"], 10),
        out=out_dir,
        perturb=Profile("off") if opts["no_perturb"] else opts["perturb"],
        seed=opts["seed"],
        isolation=opts["isolation"],
        order=opts["order"],
        chunk=opts["chunk"],
        timeout=opts["timeout"],
        backend=opts["backend"],
        detect=opts["detect"],
        pytest_args=tuple(opts["pytest_args"]),
        all_arms=all_arms,
        world_size=opts["world_size"],
        mesh=opts["mesh"],
        shard=shard,
        shard_source=shard_source,
        max_time=opts["max_time"],
        stop_rules=opts["stop_rules"],
        source=source,
    )
    if opts["delay_ms"] is not None:
        try:
            config = config.with_delay(opts["delay_ms"] / 1e3)
        except InputError as exc:
            raise run_checks.usage_error(exc) from None
    config = run_checks.checked(config, nnodes=nnodes)
    return with_run_folder(with_fingerprints(with_revisions(config)), given=opts["out_dir"])


def with_run_folder(config, *, given: Path | None):
    """The config with its run folder made: the `--out` given (once it is known to hold no one
    else's files; named in errors as given), or a new default folder, unique even beside a run
    started in the same second."""
    import dataclasses

    from racecheck.runner.run_location import new_run_folder
    from racecheck.runner.state import ForeignFolder, check_out_folder

    try:
        if given is None:
            return dataclasses.replace(config, out=new_run_folder(config.out.parent))
        check_out_folder(given)
        config.out.mkdir(parents=True, exist_ok=True)
    except ForeignFolder as exc:
        raise click.BadParameter(str(exc), param_hint="--out") from None
    except OSError as exc:
        where = given or config.out.parent
        raise click.BadParameter(f"cannot create {where}: {exc.strerror or exc}", param_hint="--out") from None
    return config


def job_shard(value):
    """(Shard, source) of --shard: as given, or for `auto` from the job's environment."""
    from racecheck.runner.blocks import Shard

    if value != "auto":
        return value or Shard(), ""
    from racecheck.runner.shard_env import from_environment

    try:
        job = from_environment(os.environ)
    except ValueError as exc:
        raise click.BadParameter(f"auto: {exc}", param_hint="--shard") from None
    return job.shard, job.source


def trials_value(value, default: int) -> int:
    if value is None:
        return default
    if value == "auto":
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
    return value


def with_revisions(config):
    """The config with every git-revision arm resolved to its commit (a bad revision: exit 2)."""
    import dataclasses

    from racecheck.runner.gitarms import resolve
    from racecheck.suites.catalogue import CatalogueError

    revisions = dict(config.revisions)
    for s in config.scenarios:
        for a in config.arms_for(s):
            try:
                arm = s.arm(a)
            except CatalogueError as exc:  # a resumed run whose config lost the arm
                raise click.UsageError(str(exc)) from None
            if arm.git and f"{s.name}/{a}" not in revisions:
                revisions[f"{s.name}/{a}"] = resolve(s.run_root, arm.git)
    return dataclasses.replace(config, revisions=revisions)


def with_fingerprints(config):
    """The config with each suite's fingerprint as it is now (suites/fingerprint.py)."""
    import dataclasses

    from racecheck.runner.run_config import split_targets
    from racecheck.suites.fingerprint import fingerprint

    prints = {s.name: fingerprint(s, tuple(split_targets(config.pytest_args, s.run_root)[0])) for s in config.scenarios}
    return dataclasses.replace(config, fingerprints=prints)


def check_unchanged(out: Path, kept: dict, config, *, allowed: bool) -> None:
    """Refuse to resume a run whose suites changed since it started (their fingerprints differ
    from those run.json `kept`; nothing is known of a run.json that kept none), unless `allowed`
    (--allow-changed-suite), which warns instead."""
    from racecheck.runner.run_config import resume_command
    from racecheck.suites.fingerprint import changes

    if not kept:
        return
    said = []
    for suite, now in config.fingerprints.items():
        moved = changes(kept.get(suite) or {}, now)
        if moved:
            said.append(f"{suite}: {', '.join(moved)}")
    if not said:
        return
    what = f"the suite changed since the run started ({'; '.join(said)})"
    if not allowed:
        raise click.UsageError(
            f"cannot resume {out}: {what}, and its new trials would be tallied with the old ones; start a "
            f"new run, or mix them anyway: {resume_command(out)} --allow-changed-suite"
        )
    click.echo(f"racecheck: warning: {what}; the run's tally mixes trials of both", err=True)


def resumed_config(ctx, opts, *, nnodes: int = 1):
    """The RunConfig of OUT/run.json, checked for `nnodes` nodes; only --trials, --timeout,
    --max-time, --stop-when, the gate options, --allow-changed-suite and --quiet may be given anew."""
    from click.core import ParameterSource

    from racecheck.runner.run_config import RunConfig
    from racecheck.runner.run_folder import open_run_folder
    from racecheck.suites import source as suite_source
    from racecheck.suites.catalogue import CatalogueError
    from racecheck.suites.project import load_suites

    given = [name for name in _DEFINING if ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE]
    if given:
        raise click.UsageError(
            f"{_option_name(ctx, given[0])} cannot be given with --resume: the run's settings come from its run.json"
        )
    out = opts["resume_dir"]
    timeout_given = ctx.get_parameter_source("timeout") is ParameterSource.COMMANDLINE
    try:
        folder = open_run_folder(out)  # run.json, its settings, its records' plan (exit 2 if spoiled)
        run, settings = folder.run, folder.settings
        source = suite_source.located(run["source"], out)  # where the suites lie now
        config = RunConfig.from_json(
            run,
            scenarios=tuple(load_suites(source)),
            source=source,
            out=out,
            trials=trials_value(opts["trials"], settings["trials"]),
            max_time=opts["max_time"],
            stop_rules=opts["stop_rules"],
            **({"timeout": opts["timeout"]} if timeout_given else {}),
        )
    except CatalogueError as exc:
        raise click.UsageError(f"cannot resume {out}: {exc}") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise click.BadParameter(f"cannot resume it: {exc}", param_hint="--resume") from None
    config = run_checks.checked(config, nnodes=nnodes)
    config = with_fingerprints(config)
    check_unchanged(out, settings.get("fingerprints", {}), config, allowed=opts["allow_changed_suite"])
    return with_revisions(config)


def _option_name(ctx, name: str) -> str:
    """How the command line spells the parameter `name` (`--config` for config_file)."""
    param = next(p for p in ctx.command.params if p.name == name)
    return param.opts[0] if isinstance(param, click.Option) else param.human_readable_name.upper()


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
