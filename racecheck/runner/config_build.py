"""Building a run's configuration from `racecheck run`'s option values (RunConfig.from_options): a
fresh run's from the options (option_table.py's rows), a resumed run's from OUT/run.json; either way
fitted to this machine's GPUs and checked (config_checks.py), its git revisions resolved, its
suites fingerprinted, and a fresh run's folder made. Every mistake is an InputError naming its
option where it has one; the command line shows it as a usage error (exit 2).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from racecheck.exitcodes import InputError
from racecheck.runner import option_table

if TYPE_CHECKING:
    from racecheck.runner.run_config import RunConfig
    from racecheck.suites.catalogue import Suite

DEFAULT_TRIALS = 10


def fresh(cls: type[RunConfig], values: Mapping[str, Any], *, nnodes: int) -> RunConfig:
    """The RunConfig (`cls`) the option `values` describe, checked for `nnodes` nodes."""
    from racecheck.perturb.profiles import Profile
    from racecheck.runner.run_location import default_parent, run_name

    suites, source = suites_from_options(values)
    arms = _arms(values["arms"], suites)
    if values["allow_changed_suite"]:
        raise InputError("--allow-changed-suite needs --resume")
    if values["perturb"] is not None and values["no_perturb"]:
        raise InputError("--perturb and --no-perturb exclude each other")
    shard, shard_source = job_shard(values["shard"])
    # The default is named here and made at the end, once the options are known to be good.
    out = values["out_dir"] or default_parent(suites[0].config_file) / run_name()
    config = cls(
        scenarios=tuple(suites),
        arms=arms,
        trials=values["trials"] or DEFAULT_TRIALS,
        out=out,
        perturb=Profile("off") if values["no_perturb"] else values["perturb"],
        all_arms=values["scenario_names"] == "all" or values["arms"] == "all",
        shard=shard,
        shard_source=shard_source,
        stop_rules=values["stop_rules"] or (),
        source=source,
        **{o.name: values[o.name] for o in option_table.ALL if o.field},
    )
    if values["delay_ms"] is not None:
        config = config.with_delay(values["delay_ms"] / 1e3)
    config = checked(config, nnodes=nnodes)
    return with_run_folder(with_fingerprints(with_revisions(config)), given=values["out_dir"])


def suites_from_options(values: Mapping[str, Any]) -> tuple[list[Suite], dict]:
    """The suites to run and their source (kept in run.json for --resume)."""
    from racecheck.suites.catalogue import CatalogueError, find_catalogue, load_catalogue, select
    from racecheck.suites.project import find_config, load_config

    names, config_file = values["scenario_names"], values["config_file"]
    if names is not None and config_file is not None:
        raise InputError("--scenario and --config exclude each other")
    try:
        if names is None:
            config_file = config_file or find_config()
        if config_file is not None:
            suite = load_config(config_file)
            return [suite], {"kind": "config", "path": str(suite.config_file)}
        folder = find_catalogue(values["scenarios_dir"])
        names = names or "main_grad_reuse"
        return select(load_catalogue(folder), names), {"kind": "catalogue", "dir": str(folder), "names": names}
    except CatalogueError as exc:
        raise InputError(str(exc)) from None


def _arms(text: str | None, suites: list[Suite]) -> tuple[str, ...] | None:
    """--arms as the arms named (None: each suite's default, or `all`), each one every suite has."""
    from racecheck.suites.catalogue import CatalogueError

    if text is None or text == "all":
        return None
    arms = tuple(dict.fromkeys(a.strip() for a in text.split(",") if a.strip()))
    if not arms:
        raise InputError("no arm named", option="--arms")
    try:
        for s in suites:
            for a in arms:
                s.arm(a)
    except CatalogueError as exc:
        raise InputError(str(exc)) from None
    return arms


def job_shard(value: Any) -> tuple[Any, str]:
    """(Shard, source) of --shard: as given, or for `auto` from the job's environment."""
    from racecheck.runner.blocks import Shard

    if value != "auto":
        return value or Shard(), ""
    from racecheck.runner.shard_env import from_environment

    try:
        job = from_environment(os.environ)
    except ValueError as exc:
        raise InputError(f"auto: {exc}", option="--shard") from None
    return job.shard, job.source


def checked(config: RunConfig, *, nnodes: int = 1) -> RunConfig:
    """The config fitted to this machine's GPUs (RunConfig.fitted_to), once it has passed its own
    checks (RunConfig.validate) for those GPUs and `nnodes` nodes."""
    gpus = cuda_devices(config.backend)
    config = config.fitted_to(gpus)
    config.validate(gpus=gpus, nnodes=nnodes)
    return config


def cuda_devices(backend: str) -> int | None:
    """The GPUs a run on `backend` uses, None when it runs on the CPU emulation. torch is imported
    only where a GPU driver is present, so that a CPU run does not pay for it here."""
    if backend == "sim":
        return None
    if backend == "auto" and not (os.path.exists("/dev/nvidia0") or os.path.exists("/proc/driver/nvidia")):
        return None
    import torch

    if not torch.cuda.is_available():
        return None  # --backend cuda without a GPU: RunConfig.validate says so
    return torch.cuda.device_count()


def with_run_folder(config: RunConfig, *, given: Path | None) -> RunConfig:
    """The config with its run folder made: the `--out` given (once it is known to hold no one
    else's files; named in errors as given), or a new default folder, unique even beside a run
    started in the same second."""
    from racecheck.runner.run_location import new_run_folder
    from racecheck.runner.state import ForeignFolder, check_out_folder

    try:
        if given is None:
            return dataclasses.replace(config, out=new_run_folder(config.out.parent))
        check_out_folder(given)
        config.out.mkdir(parents=True, exist_ok=True)
    except ForeignFolder as exc:
        raise InputError(str(exc), option="--out") from None
    except OSError as exc:
        where = given or config.out.parent
        raise InputError(f"cannot create {where}: {exc.strerror or exc}", option="--out") from None
    return config


def with_revisions(config: RunConfig) -> RunConfig:
    """The config with every git-revision arm resolved to its commit (a bad revision: exit 2)."""
    from racecheck.runner.gitarms import resolve
    from racecheck.suites.catalogue import CatalogueError

    revisions = dict(config.revisions)
    for s in config.scenarios:
        for a in config.arms_for(s):
            try:
                arm = s.arm(a)
            except CatalogueError as exc:  # a resumed run whose config lost the arm
                raise InputError(str(exc)) from None
            if arm.git and f"{s.name}/{a}" not in revisions:
                revisions[f"{s.name}/{a}"] = resolve(s.run_root, arm.git)
    return dataclasses.replace(config, revisions=revisions)


def with_fingerprints(config: RunConfig) -> RunConfig:
    """The config with each suite's fingerprint as it is now (suites/fingerprint.py)."""
    from racecheck.runner.command_lines import split_targets
    from racecheck.suites.fingerprint import fingerprint

    prints = {s.name: fingerprint(s, tuple(split_targets(config.pytest_args, s.run_root)[0])) for s in config.scenarios}
    return dataclasses.replace(config, fingerprints=prints)


def resumed(
    cls: type[RunConfig], values: Mapping[str, Any], *, given: Collection[str], nnodes: int, warn: Callable[[str], None]
) -> RunConfig:
    """The RunConfig (`cls`) of OUT/run.json, checked for `nnodes` nodes; only --trials, --timeout,
    --max-time, --stop-when, the gate options, --allow-changed-suite and --quiet may be `given`
    anew on the command line; `warn` says what a resume that is let mix trials mixes."""
    from racecheck.runner.run_folder import open_run_folder
    from racecheck.suites import source as suite_source
    from racecheck.suites.catalogue import CatalogueError
    from racecheck.suites.project import load_suites

    defining = [name for name in option_table.DEFINING if name in given]
    if defining:
        flag = option_table.BY_NAME[defining[0]].flag
        raise InputError(f"{flag} cannot be given with --resume: the run's settings come from its run.json")
    out = values["resume_dir"]
    try:
        folder = open_run_folder(out)  # run.json, its settings, its records' plan (exit 2 if spoiled)
        run, settings = folder.run, folder.settings
        source = suite_source.located(run["source"], out)  # where the suites lie now
        config = cls.from_json(
            run,
            scenarios=tuple(load_suites(source)),
            source=source,
            out=out,
            trials=values["trials"] or settings["trials"],
            max_time=values["max_time"],
            stop_rules=values["stop_rules"] or (),
            **({"timeout": values["timeout"]} if "timeout" in given else {}),
        )
    except CatalogueError as exc:
        raise InputError(f"cannot resume {out}: {exc}") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise InputError(f"cannot resume it: {exc}", option="--resume") from None
    config = with_fingerprints(checked(config, nnodes=nnodes))
    _check_unchanged(out, settings.get("fingerprints", {}), config, allowed=values["allow_changed_suite"], warn=warn)
    return with_revisions(config)


def _check_unchanged(out: Path, kept: dict, config: RunConfig, *, allowed: bool, warn: Callable[[str], None]) -> None:
    """Refuse to resume a run whose suites changed since it started (their fingerprints differ
    from those run.json `kept`; nothing is known of a run.json that kept none), unless `allowed`
    (--allow-changed-suite), which warns instead."""
    from racecheck.runner.command_lines import resume_command
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
        raise InputError(
            f"cannot resume {out}: {what}, and its new trials would be tallied with the old ones; start a "
            f"new run, or mix them anyway: {resume_command(out)} --allow-changed-suite"
        )
    warn(f"{what}; the run's tally mixes trials of both")
