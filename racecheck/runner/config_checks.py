"""A run's settings against the machine and against each other, once the suites are known: each
suite's world on the GPUs present (fit_worlds), and the checks of RunConfig.validate: every suite
gets the ranks it needs and they fit the GPUs (on the CPU, at most limits.MAX_CPU_RANKS a node) and
split over the nodes, --mesh covers the world, the stop rules name arms of the run, --backend cuda
has a GPU, and each profile can be carried out where it runs (check_perturbation).

The machine comes in as `gpus`: the GPUs a run on its backend uses, None where it runs on the CPU
emulation (the command line probes it). Every mistake is an InputError (exit 2) whose `option`
names the command-line option it is about, where there is one.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from racecheck import limits
from racecheck.exitcodes import InputError
from racecheck.suites.catalogue import SuiteKind

if TYPE_CHECKING:
    from racecheck.runner.run_config import RunConfig


def _gpus(n: int) -> str:
    return f"{n} GPU{'s' * (n != 1)}"


def fit_worlds(config: RunConfig, gpus: int | None) -> RunConfig:
    """On CUDA, every suite's world follows the machine: a catalogue scenario runs on at most one
    rank per GPU, at least its min_world_size and on a world it takes (Suite.takes_world: 4 of 6
    GPUs for a power_of_two_world scenario; one that cannot fit is skipped, with the reason
    kept for the table); a project suite that needs more ranks than there are GPUs is an input
    error (NCCL runs one rank per GPU). `--world-size` overrides both; no GPU changes nothing."""
    if gpus is None or config.world_size:
        return config
    worlds, skipped = {}, {}
    for s in config.scenarios:
        if s.world_size <= gpus:
            continue
        if s.kind is SuiteKind.PROJECT:
            raise InputError(
                f"{s.name} has world_size {s.world_size}, and this machine has {_gpus(gpus)}: give "
                f"--world-size {gpus} if the suite runs on fewer ranks, or --backend sim for a suite "
                "that does not use CUDA"
            )
        fitting = max((n for n in range(1, gpus + 1) if s.takes_world(n)), default=0)
        if not fitting:
            skipped[s.name] = {
                "arms": list(config.arms_for(s)),
                "expect": {a: s.arm(a).expect for a in config.arms_for(s)},
                "why": f"needs at least {s.min_world_size} ranks (min_world_size), this machine has {_gpus(gpus)}",
            }
        else:
            worlds[s.name] = fitting  # the most GPUs it takes (a power of two where it needs one)
    kept = tuple(s for s in config.scenarios if s.name not in skipped)
    if not kept:
        raise InputError(
            "no suite of the run fits this machine: "
            + "; ".join(f"{name} {info['why']}" for name, info in skipped.items())
        )
    return dataclasses.replace(config, scenarios=kept, worlds=worlds, skipped=skipped)


def check_run(config: RunConfig, *, gpus: int | None, nnodes: int = 1) -> None:
    """Every check of RunConfig.validate, in the order the command line reports them."""
    check_worlds(config)
    arms = {a for s in config.scenarios for a in config.arms_for(s)}
    for rule in config.stop_rules:
        if rule.arm not in arms:
            raise InputError(
                f"rule {str(rule)!r} names arm {rule.arm!r}, which the run does not "
                f"have (arms: {', '.join(sorted(arms))})",
                option="--stop-when",
            )
    check_perturbation(config)
    if config.backend == "cuda" and gpus is None:
        raise InputError("cuda: no CUDA device is available on this machine", option="--backend")
    check_placement(config, gpus=gpus, nnodes=nnodes)


def check_worlds(config: RunConfig) -> None:
    """Each suite's world: at least its min_world_size, and covered by --mesh."""
    for s in config.scenarios:
        if config.world_for(s) < s.min_world_size:
            raise InputError(
                f"{s.name} needs at least {s.min_world_size} ranks (its min_world_size), got {config.world_for(s)}",
                option="--world-size",
            )
        if not s.takes_world(config.world_for(s)):
            raise InputError(
                f"{s.name} splits its buffers evenly over a power-of-two world (its power_of_two_world), "
                f"got {config.world_for(s)}",
                option="--world-size",
            )
    for s in config.scenarios:
        if config.mesh is not None and config.mesh.world_size != config.world_for(s):
            raise InputError(
                f"mesh {config.mesh} has {config.mesh.world_size} ranks, {s.name} runs on {config.world_for(s)}",
                option="--mesh",
            )


def check_placement(config: RunConfig, *, gpus: int | None, nnodes: int = 1) -> None:
    """Each suite's world splits evenly over the nodes; on the CPU, each node's share is within
    the bound of check_cpu_ranks; on CUDA, a world given with --world-size runs one rank per GPU
    of each node (fit_worlds fits the others; NCCL refuses two ranks on one GPU, and a rank past
    the last GPU fails on an invalid device ordinal in every trial)."""
    for s in config.scenarios:
        if config.world_for(s) % nnodes:
            raise InputError(
                f"{s.name} runs {config.world_for(s)} ranks, which {nnodes} nodes cannot share evenly (--world-size)",
                option="--nnodes",
            )
    if gpus is None:
        check_cpu_ranks(config, nnodes=nnodes)
        return
    if not config.world_size:
        return
    for s in config.scenarios:
        ranks = config.world_for(s) // nnodes
        if ranks > gpus:
            where = "each node" if nnodes > 1 else "this machine"
            raise InputError(
                f"{s.name} would run {ranks} ranks on {where}, which has {_gpus(gpus)} (one rank per GPU): "
                f"give at most --world-size {gpus * nnodes}, or --backend sim for a suite that does not use CUDA",
                option="--world-size",
            )


def check_cpu_ranks(config: RunConfig, *, nnodes: int) -> None:
    """On the CPU, each node runs at most limits.MAX_CPU_RANKS ranks: every rank is a process
    that loads torch, and a world past that bound would only exhaust the machine while it starts
    (`--world-size 100000` launched 146 processes in 30 s before it failed)."""
    for s in config.scenarios:
        ranks = config.world_for(s) // nnodes
        if ranks > limits.MAX_CPU_RANKS:
            where = "each node" if nnodes > 1 else "this machine"
            raise InputError(
                f"{s.name} would run {ranks} ranks on {where}, and a run on the CPU takes at most "
                f"{limits.MAX_CPU_RANKS} per node (a process each): give at most --world-size "
                f"{limits.MAX_CPU_RANKS * nnodes}, or more nodes (--nnodes)",
                option="--world-size",
            )


def check_perturbation(config: RunConfig) -> None:
    """Each suite's profiles against what can carry them out: patch mode's grammar and a CUDA
    device for a project's own suite (exit 2 rather than a run that silently perturbs nothing),
    the runtime's points for the catalogue's scenarios."""
    from racecheck.perturb.profiles import check_where

    for s in config.scenarios:
        by_arm = {a: config.profile_for(s, a) for a in config.arms_for(s)}
        profiles = sorted(set(by_arm.values()), key=lambda p: p.to_spec())
        patch_mode = s.kind is SuiteKind.PROJECT
        for p in profiles:
            try:
                check_where(p, patch_mode=patch_mode)
            except ValueError as exc:
                where = "" if patch_mode else f"; {s.name} runs on racecheck's runtime"
                raise InputError(f"{exc}{where}", option="--perturb") from None
        if not patch_mode:
            continue
        from racecheck.perturb.patch_actions import PatchUnavailable, actions_factory

        acting = [(a, p) for a, p in by_arm.items() if not p.is_off]
        if acting or config.detect:
            need = f"the profile {acting[0][1].to_spec()!r} (arm {acting[0][0]!r})" if acting else "--detect"
            try:
                actions_factory(need=need)
            except PatchUnavailable as exc:
                raise InputError(f"{s.name}: {exc}") from None
