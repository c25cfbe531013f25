"""The collective calls patch mode wraps, as data: the entry points that every Python caller of a
collective passes, whatever it was written against.

- `torch.distributed`'s functions (`all_gather_into_tensor`, `reduce_scatter_tensor`, their
  `_single` and deprecated forms, coalescing managers) all call a method of the ProcessGroup;
  so do FSDP2 and libraries that hold a group and call it themselves. The methods are wrapped
  once on the class, so every group and every caller is seen.
- The functional collectives (`torch.distributed._functional_collectives`, under DTensor's
  redistributions such as `full_tensor()`, and in the code Inductor generates for a compiled graph)
  call `torch.ops._c10d_functional.*`, which reach the group in C++: those ops get a kernel of
  patch mode's at the dispatcher (op_kernels.py), and stay the ops they are.

A call's input tensors decide whether it is perturbed (the actions' `applies`); asynchronous
calls (`opts.asyncOp`, every functional collective) run on the group's internal stream, which
waits for the caller's current stream, so the delay must go where only the collective waits for
it (patch_actions.CudaActions.launch).
"""

from __future__ import annotations

import dataclasses
import functools


@dataclasses.dataclass(frozen=True)
class CollectiveCall:
    """A wrapped callable: its kind, the positional index of its input tensors, and whether it
    always runs asynchronously (else its options say)."""

    kind: str  # all_gather, reduce_scatter, all_reduce
    inputs: int
    always_async: bool = False

    def tensors(self, args: tuple) -> list:
        import torch

        value = args[self.inputs] if len(args) > self.inputs else None
        return [t for t in _flatten(value) if isinstance(t, torch.Tensor)]

    def is_async(self, args: tuple, kwargs: dict) -> bool:
        if self.always_async:
            return True
        opts = kwargs.get("opts", args[-1] if args else None)
        return bool(getattr(opts, "asyncOp", False))


def _flatten(value) -> list:
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _flatten(v)]
    return [value]


# ProcessGroup methods (self is args[0]): inputs of an all-reduce are its first argument, of the
# others the second. Names differ by PyTorch version; those a version lacks are skipped.
PROCESS_GROUP_METHODS = {
    "allreduce": CollectiveCall("all_reduce", 1),
    "allreduce_coalesced": CollectiveCall("all_reduce", 1),
    "allgather": CollectiveCall("all_gather", 2),
    "allgather_coalesced": CollectiveCall("all_gather", 2),
    "_allgather_base": CollectiveCall("all_gather", 2),
    "all_gather_single": CollectiveCall("all_gather", 2),
    "allgather_into_tensor_coalesced": CollectiveCall("all_gather", 2),
    "all_gather_single_coalesced": CollectiveCall("all_gather", 2),
    "reduce_scatter": CollectiveCall("reduce_scatter", 2),
    "_reduce_scatter_base": CollectiveCall("reduce_scatter", 2),
    "reduce_scatter_single": CollectiveCall("reduce_scatter", 2),
    "reduce_scatter_tensor_coalesced": CollectiveCall("reduce_scatter", 2),
    "reduce_scatter_single_coalesced": CollectiveCall("reduce_scatter", 2),
}

# torch.ops._c10d_functional ops (and their `_out` forms, which Inductor's generated code calls):
# the input comes first; the result is waited for later.
FUNCTIONAL_OPS = {
    "all_reduce": CollectiveCall("all_reduce", 0, always_async=True),
    "all_reduce_": CollectiveCall("all_reduce", 0, always_async=True),
    "all_reduce_coalesced": CollectiveCall("all_reduce", 0, always_async=True),
    "all_reduce_coalesced_": CollectiveCall("all_reduce", 0, always_async=True),
    "all_gather_into_tensor": CollectiveCall("all_gather", 0, always_async=True),
    "all_gather_into_tensor_coalesced": CollectiveCall("all_gather", 0, always_async=True),
    "reduce_scatter_tensor": CollectiveCall("reduce_scatter", 0, always_async=True),
    "reduce_scatter_tensor_coalesced": CollectiveCall("reduce_scatter", 0, always_async=True),
    "all_gather_into_tensor_out": CollectiveCall("all_gather", 0, always_async=True),
    "reduce_scatter_tensor_out": CollectiveCall("reduce_scatter", 0, always_async=True),
}
# Their autograd-aware twins (`_c10d_functional_autograd`), which DTensor and FSDP2 call where a
# collective must be differentiable.
FUNCTIONAL_NAMESPACES = ("_c10d_functional", "_c10d_functional_autograd")


def process_group_targets() -> list[tuple[type, str, CollectiveCall]]:
    """(class, method, call) for every ProcessGroup method this PyTorch has."""
    import torch.distributed as dist

    if not dist.is_available():
        return []
    methods = vars(dist.ProcessGroup)
    return [(dist.ProcessGroup, name, call) for name, call in PROCESS_GROUP_METHODS.items() if name in methods]


@functools.cache
def functional_targets() -> dict[str, list[tuple[str, str, CollectiveCall]]]:
    """By namespace: (operator, overload, call) for every functional collective this PyTorch has
    (libtorch registers them as it loads: looked up once per process, not at every install)."""
    import torch.distributed as dist

    from racecheck.perturb.op_kernels import overloads

    if not dist.is_available():
        return {}
    out: dict[str, list[tuple[str, str, CollectiveCall]]] = {}
    for namespace in FUNCTIONAL_NAMESPACES:
        found = [(name, overload, FUNCTIONAL_OPS[name]) for name, overload in overloads(namespace, FUNCTIONAL_OPS)]
        if found:
            out[namespace] = found
    return out
