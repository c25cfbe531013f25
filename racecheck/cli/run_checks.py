"""`racecheck run`'s settings against the machine and against each other, once the suites are
known: each suite's world on the GPUs present (fit_worlds, check_gpus, describe_worlds), the
world, mesh, stop rules and backend (check_run), and each profile against what can carry it out
(check_perturbation). Kept apart from run_options.py, which turns the options into a RunConfig.

User mistakes become click.UsageError/BadParameter (one line, exit 2).
"""

from __future__ import annotations

import os

import click


def fit_worlds(config):
    """On CUDA, every suite's world follows the machine: a catalogue scenario runs on at most one
    rank per GPU and at least its min_world_size (one that cannot fit is skipped, with the reason
    kept for the table); a project suite that needs more ranks than there are GPUs is a usage
    error (NCCL runs one rank per GPU). `--world-size` overrides both; --backend sim, and a
    machine without CUDA, change nothing."""
    import dataclasses

    gpus = cuda_devices(config.backend)
    if gpus is None or config.world_size:
        return config
    worlds, skipped = {}, {}
    for s in config.scenarios:
        if s.world_size <= gpus:
            continue
        if s.config_file is not None:
            raise click.UsageError(
                f"{s.name} has world_size {s.world_size}, and this machine has {gpus} "
                f"GPU{'s' * (gpus != 1)}: give --world-size {gpus} if the suite runs on "
                f"fewer ranks, or --backend sim for a suite that does not use CUDA"
            )
        if gpus < s.min_world_size:
            skipped[s.name] = {
                "arms": list(config.arms_for(s)),
                "expect": {a: s.arm(a).expect for a in config.arms_for(s)},
                "why": f"needs at least {s.min_world_size} ranks (min_world_size), "
                f"this machine has {gpus} GPU{'s' * (gpus != 1)}",
            }
        else:
            worlds[s.name] = gpus
    kept = tuple(s for s in config.scenarios if s.name not in skipped)
    if not kept:
        raise click.UsageError(
            "no suite of the run fits this machine: "
            + "; ".join(f"{name} {info['why']}" for name, info in skipped.items())
        )
    return dataclasses.replace(config, scenarios=kept, worlds=worlds, skipped=skipped)


def check_gpus(config, *, nnodes: int = 1) -> None:
    """On CUDA, a world given with --world-size (fit_worlds leaves it as given) must fit too: each
    node runs world/nnodes ranks, one per GPU (NCCL refuses two ranks on one GPU, and a rank past
    the last GPU fails on an invalid device ordinal in every trial)."""
    gpus = cuda_devices(config.backend)
    if gpus is None or not config.world_size:
        return
    for s in config.scenarios:
        ranks = config.world_for(s) // nnodes
        if ranks > gpus:
            where = "each node" if nnodes > 1 else "this machine"
            raise click.BadParameter(
                f"{s.name} would run {ranks} ranks on {where}, which has {gpus} GPU{'s' * (gpus != 1)} "
                f"(one rank per GPU): give at most --world-size {gpus * nnodes}, or --backend sim for a suite "
                "that does not use CUDA",
                param_hint="--world-size",
            )


def cuda_devices(backend: str) -> int | None:
    """The GPUs a run on `backend` uses, None when it runs on the CPU emulation. torch is imported
    only where a GPU driver is present, so that a CPU run does not pay for it here."""
    if backend == "sim":
        return None
    if backend == "auto" and not (os.path.exists("/dev/nvidia0") or os.path.exists("/proc/driver/nvidia")):
        return None
    import torch

    if not torch.cuda.is_available():
        return None  # --backend cuda without a GPU: check_run says so
    return torch.cuda.device_count()


def describe_worlds(config) -> list[str]:
    """One header line per suite: where its ranks run, and why a skipped suite does not."""
    backend = config.backend if config.backend != "auto" else ("cuda" if cuda_devices("auto") else "cpu")
    lines = []
    for s in config.scenarios:
        world = config.world_for(s)
        mesh = f", mesh {config.mesh_for(s)}" if s.config_file is None and world > 1 else ""
        lines.append(f"{s.name}: {world} rank{'s' * (world != 1)}{mesh} on {backend}")
    lines += [f"{name}: skipped, {info['why']}" for name, info in config.skipped.items()]
    return lines


def check_run(config) -> None:
    """What the options can only be checked against once the suites are known: the stop rules
    name arms of the run, every suite gets the ranks it needs, --mesh fits the world, and
    --backend cuda has a GPU."""
    for s in config.scenarios:
        if config.world_for(s) < s.min_world_size:
            raise click.BadParameter(
                f"{s.name} needs at least {s.min_world_size} ranks (its min_world_size), got {config.world_for(s)}",
                param_hint="--world-size",
            )
    if config.mesh:
        from racecheck.mesh_config import MeshConfig

        ranks = MeshConfig.parse(config.mesh).world_size
        for s in config.scenarios:
            if ranks != config.world_for(s):
                raise click.BadParameter(
                    f"mesh {config.mesh} has {ranks} ranks, {s.name} runs on {config.world_for(s)}", param_hint="--mesh"
                )
    arms = {a for s in config.scenarios for a in config.arms_for(s)}
    for rule in config.stop_rules:
        if rule.arm not in arms:
            raise click.BadParameter(
                f"rule {str(rule)!r} names arm {rule.arm!r}, which the run does not "
                f"have (arms: {', '.join(sorted(arms))})",
                param_hint="--stop-when",
            )
    check_perturbation(config)
    if config.backend == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise click.BadParameter("cuda: no CUDA device is available on this machine", param_hint="--backend")


def check_perturbation(config) -> None:
    """Each suite's profiles against what can carry them out: patch mode's grammar and a CUDA
    device for a project's own suite (exit 2 rather than a run that silently perturbs nothing),
    the runtime's points for the catalogue's scenarios."""
    from racecheck.perturb.points import HANDOFF_POINTS
    from racecheck.perturb.profiles import parse_profile

    for s in config.scenarios:
        specs = {config.spec_for(s, a) for a in config.arms_for(s)}
        profiles = [parse_profile(spec) for spec in sorted(specs)]
        if s.config_file is None:
            for p in profiles:
                if p.systematic is not None or any(r.point in HANDOFF_POINTS for r in p.rules):
                    raise click.BadParameter(
                        f"{p.to_spec()}: the systematic schedule and the hand-off points "
                        f"({', '.join(HANDOFF_POINTS)}) act in patch mode, on a project's "
                        f"own suite; {s.name} runs on racecheck's runtime",
                        param_hint="--perturb",
                    )
            continue
        from racecheck.perturb.patch import PatchMode
        from racecheck.perturb.patch_actions import PatchUnavailable, actions_factory

        acting = [p for p in profiles if not p.is_off]
        for p in acting:
            try:
                PatchMode(p, actions=object())  # the grammar check alone; nothing is installed
            except ValueError as exc:
                raise click.BadParameter(str(exc), param_hint="--perturb") from None
        if acting or config.detect:
            need = f"the profile {acting[0].to_spec()!r}" if acting else "--detect"
            try:
                actions_factory(need=need)
            except PatchUnavailable as exc:
                raise click.UsageError(f"{s.name}: {exc}") from None
