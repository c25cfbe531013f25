"""Patch mode: perturb code that is not ours, with no change to it, by wrapping torch.distributed.

The collectives of `torch.distributed` (all-gather, reduce-scatter and all-reduce, in their
tensor, list and deprecated forms, synchronous and `async_op=True`) are replaced by wrappers that
map each call to the profile's `before_all_gather` / `before_reduce_scatter` / `before_all_reduce`
point and enqueue the delay on the stream the collective actually runs on:
- synchronous (`async_op=False`): since PyTorch 2.8 ProcessGroupNCCL launches it on the caller's
  current stream, so the delay is queued there first. (From 2.2 to 2.7 it ran on the group's
  internal stream, which first waits for the current stream: the delay holds it back all the same.)
- asynchronous (`async_op=True`): it runs on the group's internal stream, which first waits for
  the current stream. Delaying the current stream would delay the caller's later work as well, so
  the wrapper issues the call from a side stream that waits for the current stream and then
  sleeps: only the collective runs late, the caller's stream runs on.
`pressure@free` watches each collective input's storage; once it has died (the program dropped
the buffer), the next wrapped call first allocates blocks of that size on the default stream and
writes them, as the program's own next allocations would. The finalizer itself cannot do it: it
runs before the block is back in the caching allocator's pool.

    racecheck.perturb.patch.CollectivePatch(parse_profile("sleep@before_reduce_scatter:2ms")).install()
    RACECHECK_PERTURB=rs_delay torchrun --nproc-per-node 2 -m racecheck.perturb.patch train.py ARGS

Reorder and poison need the runtime's view of streams and blocks and are not offered here.
"""

from __future__ import annotations

import functools
import inspect
import os
import runpy
import sys
import threading
import weakref

from racecheck.device.base import POISON_BYTE, block_size
from racecheck.perturb.points import COLLECTIVE_POINTS, FREE
from racecheck.perturb.profiles import Profile, parse_profile
from racecheck.perturb.schedule import Pressure, Sleep, make_schedule

# torch.distributed function -> (collective kind, name of its input argument)
WRAPPED = {
    "all_reduce": ("all_reduce", "tensor"),
    "all_gather": ("all_gather", "tensor"),
    "all_gather_single": ("all_gather", "input_tensor"),
    "all_gather_into_tensor": ("all_gather", "input_tensor"),
    "_all_gather_base": ("all_gather", "input_tensor"),
    "reduce_scatter": ("reduce_scatter", "input_list"),
    "reduce_scatter_single": ("reduce_scatter", "input"),
    "reduce_scatter_tensor": ("reduce_scatter", "input"),
    "_reduce_scatter_base": ("reduce_scatter", "input"),
}
PATCH_POINTS = frozenset(COLLECTIVE_POINTS.values()) | {FREE}


class CudaActions:
    """How patch mode acts on a GPU: calibrated torch.cuda._sleep, a side stream per device for
    asynchronous collectives, pressure allocations on the default stream."""

    def __init__(self) -> None:
        self._side: dict[int, object] = {}

    def applies(self, tensors) -> bool:
        return any(t.is_cuda for t in tensors)

    def stream_name(self) -> str:
        import torch

        return f"cuda-stream-{torch.cuda.current_stream().cuda_stream:#x}"

    def _cycles(self, seconds: float) -> int:
        import torch

        from racecheck.device.cuda import sleep_cycles_per_second

        return int(seconds * sleep_cycles_per_second(torch.device("cuda", torch.cuda.current_device())))

    def launch(self, call, *, delay: float, async_op: bool):
        import torch

        cycles = self._cycles(delay) if delay > 0 else 0
        if cycles <= 0:
            return call()
        current = torch.cuda.current_stream()
        if not async_op:
            torch.cuda._sleep(cycles)  # on the stream the collective runs on (see module docstring)
            return call()
        side = self._side.get(current.device.index)
        if side is None:
            side = self._side[current.device.index] = torch.cuda.Stream(current.device)
        # Producer: the caller's stream (the collective's inputs); consumer: the group's stream,
        # which waits for the stream current at the call: here the side stream, behind the delay.
        side.wait_stream(current)
        with torch.cuda.stream(side):
            torch.cuda._sleep(cycles)
            return call()

    def watch_free(self, tensor, callback) -> None:
        storage = tensor.untyped_storage()
        nbytes = storage.nbytes()
        if nbytes:
            weakref.finalize(storage, callback, nbytes)

    def pressure(self, nbytes: int) -> None:
        import torch

        with torch.cuda.stream(torch.cuda.default_stream()):
            block = torch.empty(block_size(nbytes), dtype=torch.uint8, device="cuda")
            block.fill_(POISON_BYTE)  # NaN in every float format
        del block


class CollectivePatch:
    """Wraps torch.distributed's collectives while installed (a context manager too)."""

    def __init__(self, profile: Profile, *, seed: int = 0, rank: int | None = None, actions=None) -> None:
        bad = [r.to_spec() for r in profile.rules
               if not ((r.action == "sleep" and r.point in PATCH_POINTS - {FREE} and not r.stream)
                       or (r.action == "pressure" and not r.stream))]
        if bad:
            raise ValueError(f"patch mode takes sleep@before_all_gather / before_reduce_scatter / "
                             f"before_all_reduce and pressure@free rules only, not {', '.join(bad)}")
        if rank is None:
            rank = int(os.environ.get("RANK", "0"))
        self.profile = profile
        self.schedule = make_schedule(profile, seed=seed, rank=rank)
        self.actions = actions if actions is not None else CudaActions()
        points = self.schedule.points
        self._watch_frees = points is None or FREE in points
        self._originals: list[tuple[object, str, object]] = []
        self._local = threading.local()
        self._lock = threading.RLock()  # _freed runs in finalizers, possibly inside _flush_pressure
        self._pending: list[int] = []
        self.calls: dict[str, int] = {}  # collective kind -> wrapped calls seen
        self.delayed = 0
        self.pressured = 0

    # -- install / uninstall ---------------------------------------------------------------------
    def install(self) -> "CollectivePatch":
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        if self._originals:
            raise RuntimeError("this patch is already installed")
        wrappers: dict[int, object] = {}  # one wrapper per original function, shared by modules
        for module in (dist, c10d):
            for name in WRAPPED:
                fn = getattr(module, name, None)
                if fn is None or getattr(fn, "_racecheck_patch", None) is not None:
                    continue
                wrapper = wrappers.get(id(fn))
                if wrapper is None:
                    wrapper = wrappers[id(fn)] = self._wrap(name, fn)
                self._originals.append((module, name, fn))
                setattr(module, name, wrapper)
        return self

    def uninstall(self) -> None:
        for module, name, fn in reversed(self._originals):
            setattr(module, name, fn)
        self._originals.clear()

    def __enter__(self) -> "CollectivePatch":
        return self.install()

    def __exit__(self, *exc) -> None:
        self.uninstall()

    # -- the wrapper -----------------------------------------------------------------------------
    def _wrap(self, name: str, fn):
        kind, input_name = WRAPPED[name]
        point = COLLECTIVE_POINTS[kind]
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if getattr(self._local, "inside", False):  # e.g. all_gather_into_tensor -> all_gather_single
                return fn(*args, **kwargs)
            self._local.inside = True
            try:
                return self._call(fn, args, kwargs, kind, point, signature, input_name)
            finally:
                self._local.inside = False

        wrapper._racecheck_patch = self
        return wrapper

    def _call(self, fn, args, kwargs, kind, point, signature, input_name):
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            return fn(*args, **kwargs)  # let the original report the misuse
        inputs = _tensors(bound.arguments.get(input_name))
        if not self.actions.applies(inputs):
            return fn(*args, **kwargs)
        self.calls[kind] = self.calls.get(kind, 0) + 1
        self._flush_pressure()
        actions = self.schedule.actions(point, stream=self.actions.stream_name())
        delay = sum(a.seconds for a in actions if isinstance(a, Sleep))
        async_op = bool(bound.arguments.get("async_op", False))
        if delay > 0:
            self.delayed += 1
        result = self.actions.launch(lambda: fn(*args, **kwargs), delay=delay, async_op=async_op)
        if self._watch_frees:
            for t in inputs:
                self.actions.watch_free(t, self._freed)
        return result

    def _freed(self, nbytes: int) -> None:
        # A finalizer: it may run on any thread, inside any call; only note the free here.
        if any(isinstance(a, Pressure) for a in self.schedule.actions(FREE, stream="default")):
            with self._lock:
                self._pending.append(nbytes)

    def _flush_pressure(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        for nbytes in pending:
            self.actions.pressure(nbytes)
            self.pressured += 1


def _tensors(value) -> list:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [v for v in value if isinstance(v, torch.Tensor)]
    return []


def install_from_env() -> CollectivePatch | None:
    """Install patch mode for $RACECHECK_PERTURB (seeded by $RACECHECK_SEED), if set and not off."""
    from racecheck.perturb.injector import ENV_VAR, env_seed

    profile = parse_profile(os.environ.get(ENV_VAR, "off"))
    if profile.is_off:
        return None
    return CollectivePatch(profile, seed=env_seed()).install()


def main(argv: list[str] | None = None) -> int:
    """`python -m racecheck.perturb.patch [--perturb SPEC] [--seed N] SCRIPT [ARGS...]`: run SCRIPT
    as __main__ with patch mode installed (under torchrun: `-m racecheck.perturb.patch`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    usage = "usage: python -m racecheck.perturb.patch [--perturb SPEC] [--seed N] SCRIPT [ARGS...]"
    while argv and argv[0].startswith("-"):
        opt = argv.pop(0)
        if opt in ("-h", "--help"):
            print(usage + "\n\n" + __doc__)
            return 0
        if opt not in ("--perturb", "--seed") or not argv:
            print(usage, file=sys.stderr)
            return 2
        os.environ["RACECHECK_PERTURB" if opt == "--perturb" else "RACECHECK_SEED"] = argv.pop(0)
    if not argv:
        print(usage, file=sys.stderr)
        return 2
    if not os.path.isfile(argv[0]):
        print(f"racecheck.perturb.patch: {argv[0]}: no such script", file=sys.stderr)
        return 2
    try:
        install_from_env()
    except ValueError as exc:
        print(f"racecheck.perturb.patch: {exc}", file=sys.stderr)
        return 2
    sys.argv = argv
    runpy.run_path(argv[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
