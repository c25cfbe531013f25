"""Patch mode's hold on operators: a Python function run around every real call of chosen
operators, registered with the dispatcher, so that no object torch or another library looks up is
replaced.

The functional collectives (`torch.ops._c10d_functional.*`: DTensor's redistributions, FSDP2's
compiled paths, the code Inductor generates for a compiled graph) reach their process group in
C++, so patch mode cannot wrap a Python function under them. Replacing the ops on their namespace
breaks whatever looks them up afterwards (`torch.library.register_autograd`, Inductor's lowerings,
a lazy `import torch.distributed.fsdp`): an `OpOverloadPacket` must stay one, with its overloads.
Here the function is a kernel of the op, added with `torch.library` for the time patch mode is
installed; uninstalling removes the registration, and the dispatch table is as it was.

[Note: where an operator's wrapper sits]
The kernel is registered at the BackendSelect dispatch key, the last before the backend's own
kernel, and continues the call with `redispatch` to the keys after it, exactly as the dispatcher
would have without it:
- everything above it has had its turn: autograd, functionalization, a TorchDispatchMode, a tensor
  subclass. What reaches it is a call about to run on real tensors, on the calling thread;
- a call on tensors that carry the Python key (fake tensors while Dynamo and Inductor trace,
  subclasses) is not run but traced: it passes through untouched, so compiling sees no action;
- BackendSelect is in every thread's included set and no mode excludes it (unlike ADInplaceOrView,
  which `torch.inference_mode` removes), so every real call passes, eager or compiled, made from
  Python or from C++.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

# (handle, args, kwargs, continue_call) -> the op's result; continue_call() runs the op unwrapped.
Around = Callable[..., object]

_KEY = "BackendSelect"


def is_traced(tensors: Iterable) -> bool:
    """Whether any of the call's tensors is a fake tensor or a subclass (it carries the Python
    key): the call is being traced, not run."""
    import torch

    python = torch._C.DispatchKey.Python
    return any(torch._C._dispatch_keys(t).has(python) for t in tensors)


def overloads(namespace: str, names: Iterable[str]) -> list[tuple[str, str]]:
    """(operator name, overload name) of every overload this PyTorch has of `namespace::name`
    for each of `names`; names it lacks are skipped."""
    import torch

    known = set(torch._C._dispatch_get_all_op_names())
    out = []
    for name in names:
        qualified = f"{namespace}::{name}"
        if qualified in known:
            out += [(name, s.overload_name) for s in torch._C._jit_get_schemas_for_operator(qualified)]
    return out


class OpKernels:
    """While installed, `around` runs for every real call of the given overloads of `namespace`
    ([Note: where an operator's wrapper sits]). One instance per namespace can be installed at a
    time in a process (the dispatcher keeps one Python kernel per operator and key): `install`
    returns False, and registers nothing, while another holds it."""

    _holders: dict[str, OpKernels] = {}  # namespace -> the installed instance

    def __init__(self, namespace: str, targets: Sequence[tuple[str, str, object]], around: Around) -> None:
        """`targets`: (operator name, overload name, its data for `around`)."""
        self.namespace = namespace
        self.targets = targets
        self.around = around
        self._library: Any = None  # the torch.library.Library holding the kernels while installed

    def install(self) -> bool:
        import torch

        if self.namespace in OpKernels._holders:
            return False
        library = torch.library.Library(self.namespace, "IMPL")
        after = torch._C._dispatch_keyset_full_after(torch._C.DispatchKey.BackendSelect)
        for name, overload, data in self.targets:
            handle = torch._C._dispatch_find_schema_or_throw(f"{self.namespace}::{name}", overload)
            qualified = f"{name}.{overload}" if overload else name
            library.impl(qualified, self._kernel(handle, after, data), _KEY, with_keyset=True)
        self._library = library
        OpKernels._holders[self.namespace] = self
        return True

    def uninstall(self) -> None:
        if self._library is not None:
            self._library._destroy()
            self._library = None
            OpKernels._holders.pop(self.namespace, None)

    def _kernel(self, handle, after, data):
        around = self.around

        def kernel(keyset, *args, **kwargs):
            def continue_call():
                return handle.redispatch_boxed(keyset & after, *args, **kwargs)

            return around(data, args, kwargs, continue_call)

        return kernel
