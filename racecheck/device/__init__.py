"""The stream runtime: pick a backend (`sim` on the CPU, `cuda` on a GPU) and hold the process's one runtime.

`init_runtime("auto")` takes CUDA when a GPU is present and the CPU emulation otherwise; the
environment variable RACECHECK_BACKEND overrides "auto" for processes a launcher starts.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from racecheck.device.points import Point
from racecheck.protocol.names import BACKEND_VAR

if TYPE_CHECKING:
    from racecheck.device.base import CommGroup, Event, MemRange, ReduceOp, Runtime, RuntimeObserver, Stream

# The interface's names load torch: they are imported on first use, so that a torch-free caller
# (profile parsing in the pytest plugin, through racecheck.perturb.points) can import `Point`.
_FROM_BASE = ("CommGroup", "Event", "MemRange", "ReduceOp", "Runtime", "RuntimeObserver", "Stream")


def __getattr__(name: str):
    if name in _FROM_BASE:
        from racecheck.device import base

        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


BACKENDS = ("sim", "cuda")

_runtime: Runtime | None = None


def resolve_backend(name: str = "auto") -> str:
    if name == "auto":
        name = os.environ.get(BACKEND_VAR, "auto")
    if name == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "sim"
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)} or auto")
    return name


def init_runtime(backend: str = "auto") -> Runtime:
    """Create the process's runtime (replacing an earlier one) and return it."""
    global _runtime
    if _runtime is not None:
        _runtime.close()
    name = resolve_backend(backend)
    if name == "cuda":
        from racecheck.device.cuda import CudaRuntime

        _runtime = CudaRuntime()
    else:
        from racecheck.device.sim import SimRuntime

        _runtime = SimRuntime()
    return _runtime


def get_runtime() -> Runtime:
    """The process's runtime, created with the "auto" backend on first use."""
    return _runtime if _runtime is not None else init_runtime()


def shutdown_runtime() -> None:
    global _runtime
    if _runtime is not None:
        _runtime.close()
        _runtime = None


__all__ = [
    "BACKENDS",
    "CommGroup",
    "Event",
    "MemRange",
    "Point",
    "ReduceOp",
    "Runtime",
    "RuntimeObserver",
    "Stream",
    "get_runtime",
    "init_runtime",
    "resolve_backend",
    "shutdown_runtime",
]
