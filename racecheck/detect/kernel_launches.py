"""Kernel launches below the dispatcher: Inductor's generated Triton kernels and a user's
`@triton.jit` kernels, reported to the active tracker with the tensors each reads and writes, on
the stream it is launched on.

A Triton kernel goes from its launcher straight to the CUDA driver: no operator runs, so neither a
TorchDispatchMode nor RecordFunction sees it. Every launch passes one of two Python methods, which
the watch wraps while a tracker records:
- `torch._inductor.runtime.triton_heuristics.CachingAutotuner.run`: every kernel of the code
  Inductor generates (whichever launcher it then uses, its static launcher included), with
  `stream=` the raw stream it launches on;
- `triton.runtime.jit.JITFunction.run`: a user's kernel called eagerly (`kernel[grid](...)`, and
  through `triton.autotune` and `triton.heuristics`), on the current stream.
Both are class attributes, wrapped in place: the classes stay the classes, Dynamo (which knows
Triton kernels by their class) and Inductor see what they always see, and uninstalling puts the
methods back. A module imported after the watch started gets its wrapper as it finishes loading
(an import hook, removed with the watch), so the order of imports does not matter.

[Note: a kernel's reads and writes]
- Inductor names a kernel's pointer arguments by their role: `out_ptrN` is written, `in_out_ptrN`
  read and written, `ws_ptr` (a workspace) written, every other tensor argument read.
- Any other kernel (a user's, called eagerly or from compiled code): PyTorch's own analysis of the
  kernel's Triton IR, the one torch.compile runs on user kernels (torch._higher_order_ops.
  triton_kernel_wrap), once per kernel and argument types. Where it cannot tell (it then assumes
  every argument written), the kernel's tensors count as reads: a free-while-in-use race by the
  kernel is still found (a read keeps the block in use as a write does), a write it makes may be
  missed, and no read that another stream shares is taken for a write, which would be a false
  alarm. The tracker counts such launches by kernel (`unseen_kernels`), and the run says so.
"""

from __future__ import annotations

import importlib.abc
import logging
import re
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

INDUCTOR = "torch._inductor.runtime.triton_heuristics"
TRITON_JIT = "triton.runtime.jit"
_INDUCTOR_ROLE = re.compile(r"^(in_out_ptr|out_ptr|in_ptr|ws_ptr)\d*$")
_INDUCTOR_KERNEL = re.compile(r"^triton_(poi|per|red|tem|for|mix|spl|unk)_")

# A launch as the tracker takes it: (kernel name, raw stream or None for the current one,
# tensors read, tensors written, whether the writes are known).
Report = Callable[[str, int | None, list, list, bool], None]


def inductor_roles(names: list[str], signature: dict) -> tuple[tuple[int, bool, bool], ...] | None:
    """(position, read, written) of each pointer argument of an Inductor kernel, by its name
    ([Note: a kernel's reads and writes]); None when a pointer's name is not one of Inductor's.
    `names` are the arguments a launch passes, in order; `signature` their Triton types."""
    roles = []
    for i, name in enumerate(names):
        if not str(signature.get(name, "")).startswith("*"):
            continue  # a size or a constant, not memory
        match = _INDUCTOR_ROLE.match(name)
        if match is None:
            return None
        role = match.group(1)
        roles.append((i, role in ("in_out_ptr", "in_ptr"), role in ("in_out_ptr", "out_ptr", "ws_ptr")))
    return tuple(roles)


class _InductorPlan:
    """What a CachingAutotuner's launches touch, worked out at its first launch: the names of the
    arguments a launch passes and, for a kernel Inductor generated, its pointers' roles (None: a
    user's kernel, whose writes the analysis tells)."""

    __slots__ = ("name", "names", "roles")

    def __init__(self, tuner) -> None:
        signature = tuner.triton_meta.get("signature", {})
        self.names = [n for n in tuner.fn.arg_names if signature.get(n) != "constexpr"]
        self.name = str(tuner.inductor_meta.get("kernel_name") or tuner.fn.__name__)
        self.roles = inductor_roles(self.names, signature) if _INDUCTOR_KERNEL.match(self.name) else None


def _is_tensor(value) -> bool:
    import torch

    return isinstance(value, torch.Tensor)


class _FallbackSeen(logging.Handler):
    """Catches the analysis' warning that it could not tell and assumed every argument written."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen = False

    def emit(self, record: logging.LogRecord) -> None:
        if "assuming every input is mutated" in record.getMessage():
            self.seen = True


class KernelAnalysis:
    """The written arguments of a user kernel, from PyTorch's analysis of its Triton IR, cached by
    kernel and argument types; None where the analysis could not tell."""

    def __init__(self) -> None:
        self._known: dict[tuple, frozenset[str] | None] = {}

    def written(self, kernel, kwargs: dict[str, Any]) -> frozenset[str] | None:
        key = (id(kernel), *sorted((k, _type_key(v)) for k, v in kwargs.items()))
        if key not in self._known:
            self._known[key] = self._analyze(kernel, kwargs)
        return self._known[key]

    @staticmethod
    def _analyze(kernel, kwargs: dict[str, Any]) -> frozenset[str] | None:
        try:
            from torch._higher_order_ops import triton_kernel_wrap as wrap
        except ImportError:
            return None
        catch = _FallbackSeen()
        level = wrap.log.level
        wrap.log.addHandler(catch)
        wrap.log.setLevel(logging.WARNING)  # its warning is the only sign that it could not tell
        try:
            accessed = getattr(wrap, "identify_accessed_tensors", None)  # PyTorch >= 2.12: reads and writes
            mutated = getattr(wrap, "identify_mutated_tensors", None)  # before: the writes
            if accessed is not None:
                written = frozenset(dep.name for dep in accessed(kernel, kwargs, {}).read_writes.writes)
            elif mutated is not None:
                written = frozenset(mutated(kernel, kwargs, {}))
            else:
                return None
        except Exception:  # noqa: BLE001 - an analysis that fails tells nothing
            return None
        finally:
            wrap.log.removeHandler(catch)
            wrap.log.setLevel(level)
        return None if catch.seen else written


def _type_key(value) -> object:
    """What the analysis of a kernel depends on in one argument: a tensor's dtype, a constant's value."""
    if _is_tensor(value):
        return ("tensor", str(value.dtype))
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    return type(value).__name__


class KernelWatch:
    """Wraps the two launch methods (module docstring) while installed and reports each launch to
    `report`. One watch at a time in a process; `install` returns False while another is installed."""

    _installed: KernelWatch | None = None
    _lock = threading.Lock()

    def __init__(self, report: Report, error: Callable[[str], None]) -> None:
        self.report = report
        self.error = error  # an internal failure, said by the tracker (never raised into the program)
        self.analysis = KernelAnalysis()
        # Each compiled kernel's plan, made at its first launch (the kernel dies with its code).
        self._plans: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._originals: list[tuple[type, str, object]] = []
        self._hook: _OnImport | None = None
        self._local = threading.local()  # inside a reported launch (autotuning, nested runs)

    def install(self) -> bool:
        with KernelWatch._lock:
            if KernelWatch._installed is not None:
                return False
            KernelWatch._installed = self
        self._hook = _OnImport({INDUCTOR: self._wrap_inductor, TRITON_JIT: self._wrap_triton})
        sys.meta_path.insert(0, self._hook)
        for name, wrap in ((INDUCTOR, self._wrap_inductor), (TRITON_JIT, self._wrap_triton)):
            module = sys.modules.get(name)
            if module is not None:
                wrap(module)
        return True

    def uninstall(self) -> None:
        if self._hook is not None:
            if self._hook in sys.meta_path:
                sys.meta_path.remove(self._hook)
            self._hook = None
        for owner, name, original in reversed(self._originals):
            setattr(owner, name, original)
        self._originals.clear()
        with KernelWatch._lock:
            if KernelWatch._installed is self:
                KernelWatch._installed = None

    # -- the wrappers ----------------------------------------------------------------------
    def _replace(self, owner: type, name: str, make) -> None:
        original = owner.__dict__.get(name)
        if original is None or getattr(original, "_racecheck_watch", None) is not None:
            return
        wrapper = make(original)
        wrapper._racecheck_watch = self
        wrapper.__wrapped__ = original
        self._originals.append((owner, name, original))
        setattr(owner, name, wrapper)

    def _wrap_inductor(self, module) -> None:
        tuner = getattr(module, "CachingAutotuner", None)
        if tuner is not None:
            self._replace(tuner, "run", self._inductor_run)

    def _wrap_triton(self, module) -> None:
        jit = getattr(module, "JITFunction", None)
        if jit is not None:
            self._replace(jit, "run", self._triton_run)

    def _inductor_run(self, original):
        watch = self

        def run(tuner, *args, stream, **kwargs):
            if not getattr(watch._local, "inside", False) and not kwargs.get("benchmark_run"):
                watch._guarded(watch._inductor_launch, tuner, args, stream)
            watch._local.inside = True
            try:
                return original(tuner, *args, stream=stream, **kwargs)
            finally:
                watch._local.inside = False

        return run

    def _triton_run(self, original):
        watch = self

        def run(kernel, *args, grid, warmup, **kwargs):
            if not warmup and not getattr(watch._local, "inside", False):
                watch._guarded(watch._triton_launch, kernel, args, kwargs)
            return original(kernel, *args, grid=grid, warmup=warmup, **kwargs)

        return run

    def _guarded(self, fn, *args) -> None:
        try:
            fn(*args)
        except Exception as exc:  # noqa: BLE001 - never break the program under test
            self.error(f"kernel launch: {type(exc).__name__}: {exc}")

    # -- what a launch touches ---------------------------------------------------------------
    def _inductor_launch(self, tuner, args: tuple, stream) -> None:
        plan = self._plans.get(tuner)
        if plan is None:
            plan = self._plans[tuner] = _InductorPlan(tuner)
        if plan.roles is not None:  # Inductor's own kernel: its pointers by their roles
            reads = [args[i] for i, read, _ in plan.roles if read and i < len(args)]
            writes = [args[i] for i, _, written in plan.roles if written and i < len(args)]
            if reads or writes:
                self.report(plan.name, stream, reads, writes, True)
            return
        kwargs = dict(zip(plan.names, args, strict=False))
        kwargs.update(tuner.triton_meta.get("constants") or {})
        if tuner.launchers:
            kwargs.update(getattr(tuner.launchers[0].config, "kwargs", {}) or {})
        self._user_launch(plan.name, tuner.fn, kwargs, stream)

    def _triton_launch(self, kernel, args: tuple, kwargs: dict) -> None:
        bound = dict(zip(kernel.arg_names, args, strict=False))
        bound.update(kwargs)
        self._user_launch(kernel.fn.__name__, kernel, bound, None)

    def _user_launch(self, name: str, kernel, kwargs: dict, stream) -> None:
        tensors = {k: v for k, v in kwargs.items() if _is_tensor(v)}
        if not tensors:
            return
        written = self.analysis.written(kernel, kwargs)
        if written is None:
            self.report(name, stream, list(tensors.values()), [], False)
            return
        reads = list(tensors.values())  # a written argument is read too, unless proved otherwise
        self.report(name, stream, reads, [v for k, v in tensors.items() if k in written], True)


class _OnImport(importlib.abc.MetaPathFinder):
    """Calls `hooks[name](module)` once the module `name` has been executed, whoever imports it.

    It finds the module's spec with the finders after it and runs the module's own loader; the
    module keeps that loader (`__loader__`, `__spec__.loader`), as without the hook."""

    def __init__(self, hooks: dict[str, Callable]) -> None:
        self.hooks = hooks

    def find_spec(self, fullname, path, target=None):
        hook = self.hooks.get(fullname)
        if hook is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _ThenHook(spec.loader, hook)
                return spec
        return None


class _ThenHook(importlib.abc.Loader):
    def __init__(self, loader, hook: Callable) -> None:
        self.loader, self.hook = loader, hook

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        module.__spec__.loader = module.__loader__ = self.loader  # the module's own, as without the hook
        self.loader.exec_module(module)
        self.hook(module)
