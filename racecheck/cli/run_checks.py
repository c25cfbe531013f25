"""`racecheck run` against the machine: the GPUs it has (cuda_devices), the config fitted to them
and checked (checked: RunConfig.fitted_to and RunConfig.validate, in racecheck.runner) with its
input errors turned into the command line's usage errors (one line, exit 2), naming the option,
and the one header line per suite that says where it runs (describe_worlds).
"""

from __future__ import annotations

import os

import click

from racecheck.exitcodes import InputError


def usage_error(exc: InputError) -> click.UsageError:
    """The command line's form of a config's InputError: `Invalid value for --mesh: ...` where it
    names its option, else the message as it is."""
    if exc.option:
        return click.BadParameter(str(exc), param_hint=exc.option)
    return click.UsageError(str(exc))


def checked(config, *, nnodes: int = 1):
    """The config fitted to this machine's GPUs (RunConfig.fitted_to), once it has passed its own
    checks (RunConfig.validate) for those GPUs and `nnodes` nodes."""
    gpus = cuda_devices(config.backend)
    try:
        config = config.fitted_to(gpus)
        config.validate(gpus=gpus, nnodes=nnodes)
    except InputError as exc:
        raise usage_error(exc) from None
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


def describe_worlds(config) -> list[str]:
    """One header line per suite: where its ranks run, and why a skipped suite does not."""
    from racecheck.suites.catalogue import SuiteKind

    backend = config.backend if config.backend != "auto" else ("cuda" if cuda_devices("auto") else "cpu")
    lines = []
    for s in config.scenarios:
        world = config.world_for(s)
        mesh = f", mesh {config.mesh_for(s)}" if s.kind is SuiteKind.SCENARIO and world > 1 else ""
        lines.append(f"{s.name}: {world} rank{'s' * (world != 1)}{mesh} on {backend}")
    lines += [f"{name}: skipped, {info['why']}" for name, info in config.skipped.items()]
    return lines
