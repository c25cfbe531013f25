"""Which tensors an ATen operator reads and which it writes, decided from its schema.

The rules are torch.cuda._sanitizer's (its ArgumentHandler): an argument with a mutable alias
annotation (`Tensor(a!)`) is written; an argument with a non-mutable alias (`Tensor(a)`: a view's
input) and every argument of a factory function (`new_*`, `*_like`) only has its metadata read;
every other tensor argument is read; the returns are written unless they alias an input without
mutating it (views) or come from a factory. What differs is the cost: the sanitizer parses every
call's arguments with pytree, while here each operator's schema is compiled once into a plan of
argument positions, and a call only indexes into its arguments.

Importing torch.cuda._sanitizer has a side effect: its module-level, disabled CUDASanitizer
registers its event handler with the CUDA trace callbacks and switches tracing on, after which that
handler captures a full stack at every CUDA allocation. `sanitizer_module()` takes the disabled
sanitizer's handler off again (and puts it back should someone enable the sanitizer later), so
using racecheck's trackers does not pay for a tool that is not running.
"""

from __future__ import annotations

import enum
import functools

import torch

from racecheck.detect.feed_apply import READ, RESOLVE, WRITE

_HANDLER_CALLBACKS = {  # torch.cuda._gpu_trace registry -> the EventHandler method it calls
    "EventCreationCallbacks": "_handle_event_creation",
    "EventDeletionCallbacks": "_handle_event_deletion",
    "EventRecordCallbacks": "_handle_event_record",
    "EventWaitCallbacks": "_handle_event_wait",
    "MemoryAllocationCallbacks": "_handle_memory_allocation",
    "MemoryDeallocationCallbacks": "_handle_memory_deallocation",
    "StreamCreationCallbacks": "_handle_stream_creation",
    "DeviceSynchronizationCallbacks": "_handle_device_synchronization",
    "StreamSynchronizationCallbacks": "_handle_stream_synchronization",
    "EventSynchronizationCallbacks": "_handle_event_synchronization",
}


def set_trace_handler(handler, *, attached: bool) -> None:
    """Register (or unregister) an EventHandler's methods with the CUDA trace callbacks."""
    import torch.cuda._gpu_trace as gpu_trace

    for registry_name, method in _HANDLER_CALLBACKS.items():
        registry = getattr(gpu_trace, registry_name)
        bound = getattr(handler, method)
        if attached:
            registry.add_callback(bound)
        else:
            while bound in registry.callback_list:
                registry.callback_list.remove(bound)


@functools.cache
def sanitizer_module():
    """torch.cuda._sanitizer, with its disabled instance's trace handler taken off (see above)."""
    from torch.cuda import _sanitizer

    san = _sanitizer.cuda_sanitizer
    if not san.enabled:
        handler = san.dispatch.event_handler
        set_trace_handler(handler, attached=False)
        enable = san.enable

        def enable_with_handler():
            set_trace_handler(handler, attached=True)
            san.enable = enable
            enable()

        san.enable = enable_with_handler
    return _sanitizer


class OpKind(enum.Enum):
    PLAIN = "plain"
    RECORD_STREAM = "record_stream"
    COLLECTIVE = "collective"  # c10d: may run on another stream than the current one
    SKIP = "skip"  # touches no tensor data


class OpPlan:
    """The data-touching tensor arguments of one operator overload."""

    __slots__ = ("name", "kind", "args", "writes_returns", "multi_return", "call", "blocks_host")

    def __init__(self, name: str, kind: OpKind, args: tuple, writes_returns: bool, multi_return: bool) -> None:
        self.call = None  # the operator without OpOverload.__call__'s Python frame (set by plan_for)
        self.name = name
        self.kind = kind
        self.args = args  # (position, name, is_write, is_list)
        self.writes_returns = writes_returns
        self.multi_return = multi_return
        # The host waits for the current stream before the call returns (`.item()`); copies
        # between host and device decide per call (torch_tracker, [Note: host accesses]).
        self.blocks_host = name.rsplit(".", 1)[0] in _HOST_BLOCKING

    def tensors(self, args: tuple, kwargs: dict, out) -> tuple[list, list]:
        """(read tensors, written tensors) of one call."""
        reads: list = []
        writes: list = []
        n = len(args)
        for pos, name, is_write, is_list in self.args:
            value = args[pos] if pos < n else kwargs.get(name)
            if value is None:
                continue
            dst = writes if is_write else reads
            if is_list:
                for v in value:
                    if isinstance(v, torch.Tensor):
                        dst.append(v)
                    elif isinstance(v, (tuple, list)):  # Tensor[][] (c10d's allgather_)
                        dst.extend(x for x in v if isinstance(x, torch.Tensor))
            elif isinstance(value, torch.Tensor):
                dst.append(value)
        if self.writes_returns and out is not None:
            if isinstance(out, torch.Tensor):
                writes.append(out)
            else:
                writes.extend(returned_tensors(out))
        return reads, writes


KERNEL_OVERLOAD = "<kernel>"  # op_log.cpp's overload name for a kernel's pseudo-operator


def kernel_plan(name: str) -> OpPlan:
    """The plan of a kernel launched below the dispatcher (kernel_launches.py): called with
    (reads, writes), the two lists of tensors the launch touches."""
    return OpPlan(name, OpKind.PLAIN, ((0, "reads", False, True), (1, "writes", True, True)), False, False)


def returned_tensors(out) -> list:
    """The tensors an operator returned: the tensor itself, or those in its tuple or list (one
    level of nesting too, as in c10d's allgather)."""
    if isinstance(out, torch.Tensor):
        return [out]
    found = []
    if isinstance(out, (tuple, list)):
        for v in out:
            if isinstance(v, torch.Tensor):
                found.append(v)
            elif isinstance(v, (tuple, list)):
                found.extend(x for x in v if isinstance(x, torch.Tensor))
    return found


_plans: dict = {}
_HOST_BLOCKING = frozenset({"aten._local_scalar_dense", "aten.item"})
_UNINITIALIZED = frozenset({"empty", "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided"})


def plan_for(func) -> OpPlan:
    plan = _plans.get(func)
    if plan is None:
        plan = _plans[func] = _compile(func)
        plan.call = getattr(func, "_op", func)  # OpOverload._op: the C++ operator it wraps
    return plan


def _is_tensor_type(t) -> bool:
    return "Tensor" in str(t)


def _compile(func) -> OpPlan:
    schema = func._schema
    name = str(func)
    if func is torch.ops.aten.record_stream.default:
        return OpPlan(name, OpKind.RECORD_STREAM, (), False, False)
    namespace = getattr(func, "namespace", schema.name.split("::")[0])
    if namespace == "c10d":
        return _compile_collective(func, name)
    factory = bool(sanitizer_module().FACTORY_FUNCTION_REGEX.match(schema.name.split("::")[-1]))
    args = []
    for pos, arg in enumerate(schema.arguments):
        if not _is_tensor_type(arg.type):
            continue
        alias = arg.alias_info
        is_write = alias is not None and alias.is_write
        metadata_only = factory or (alias is not None and not alias.is_write)
        if is_write or not metadata_only:
            args.append((pos if not arg.kwarg_only else 1 << 30, arg.name, is_write, str(arg.type).startswith("List[")))
    returns = [r for r in schema.returns if _is_tensor_type(r.type)]
    writes_returns = not factory and any(r.alias_info is None or r.alias_info.is_write for r in returns)
    if schema.name.split("::")[-1] in _UNINITIALIZED:
        # Fresh memory that nothing wrote: its reuse is checked at the allocation, and calling it
        # a write would order every other stream after the allocating one for no reason.
        writes_returns = False
    if not args and not writes_returns:
        kind = OpKind.SKIP
    else:
        kind = OpKind.PLAIN
    return OpPlan(name, kind, tuple(args), writes_returns, len(schema.returns) > 1)


def _compile_collective(func, name: str) -> OpPlan:
    """c10d's schemas carry no alias annotations (the sanitizer's rules would call every output
    a read), so a collective's accesses come from its argument names: `output*` is written,
    `input*` read, and the in-place `tensors` of all-reduce, broadcast, reduce and recv are read and
    written (send only reads them). The returns alias those arguments and add nothing."""
    op = func._schema.name.split("::")[-1]
    if op.startswith("barrier") or op.startswith("monitored_barrier"):
        return OpPlan(name, OpKind.SKIP, (), False, False)
    args = []
    for pos, arg in enumerate(func._schema.arguments):
        if not _is_tensor_type(arg.type):
            continue
        is_list = str(arg.type).startswith("List[")
        lowered = arg.name.lower()
        if lowered.startswith("output"):
            args.append((pos, arg.name, True, is_list))
        elif lowered.startswith("input") or lowered.startswith("sparse"):
            args.append((pos, arg.name, False, is_list))
        else:  # in-place buffers
            args.append((pos, arg.name, False, is_list))
            if not op.startswith("send"):
                args.append((pos, arg.name, True, is_list))
    return OpPlan(name, OpKind.COLLECTIVE, tuple(args), False, False)


def byte_range(t: torch.Tensor) -> tuple[int, int]:
    """(first byte, number of bytes) that `t` spans in its storage; a strided view spans the
    bytes from its first to its last element."""
    n = t.numel()
    if n == 0:
        return t.data_ptr(), 0
    if t.is_contiguous():
        return t.data_ptr(), n * t.element_size()
    span = 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride(), strict=True) if s > 1)
    return t.data_ptr(), span * t.element_size()


# -- the native recording path (op_log.cpp) ------------------------------------------------------
# Its kinds (op_log.cpp's Kind enum); its access codes are feed_apply.py's (the Access enum).
NATIVE_KINDS = {OpKind.PLAIN: 0, OpKind.SKIP: 1, OpKind.COLLECTIVE: 3, OpKind.RECORD_STREAM: 4}
NATIVE_TRANSPARENT = 2


def overload_named(name: str, overload: str):
    """The OpOverload `ns::op` `overload` ("" is the default overload)."""
    namespace, _, op = name.partition("::")
    packet = getattr(getattr(torch.ops, namespace), op)
    return getattr(packet, overload or "default")


def decomposes(func) -> bool:
    """Whether the dispatcher runs `func` as its CompositeImplicitAutograd decomposition, so a
    TorchDispatchMode never sees it, only what it calls: it has that kernel and none of its own
    for a backend or as CompositeExplicitAutograd."""
    name = func.name()
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    if not has(name, "CompositeImplicitAutograd"):
        return False
    return not any(has(name, key) for key in ("CPU", "CUDA", "CompositeExplicitAutograd"))


def native_plan(name: str, overload: str) -> tuple:
    """The plan op_log.cpp applies to every call of one operator overload, from plan_for's (the
    Python path's rules): (kind, ((argument position, access), ...), access of the returns or -1,
    position of `non_blocking` or -1). Positions count every argument, keyword-only ones too (a
    RecordFunction sees the call boxed, in schema order)."""
    func = overload_named(name, overload)
    if decomposes(func):
        return (NATIVE_TRANSPARENT, (), -1, -1)
    plan = plan_for(func)
    positions = {arg.name: i for i, arg in enumerate(func._schema.arguments)}
    inputs = tuple((positions[arg_name], WRITE if is_write else READ) for _, arg_name, is_write, _ in plan.args)
    if plan.kind is OpKind.RECORD_STREAM:
        inputs = ((0, READ),)  # which block: record_stream reads nothing
    if plan.kind is not OpKind.PLAIN:
        returns = -1
    elif plan.writes_returns:
        returns = WRITE
    else:  # a return may be the first sight of a fresh block, which sizes it ([Note: pending allocations])
        returns = RESOLVE
    return (NATIVE_KINDS[plan.kind], inputs, returns, positions.get("non_blocking", -1))


def non_blocking(plan, args: tuple, kwargs: dict) -> bool:
    """Whether a copy was asked to return before the stream did it (copy_'s third argument,
    _to_copy's keyword)."""
    if "non_blocking" in kwargs:
        return bool(kwargs["non_blocking"])
    return plan.name.startswith("aten.copy_") and len(args) > 2 and bool(args[2])
