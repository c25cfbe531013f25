"""The copies of generated programs written as other code than copy_ (program_ops.FORMS): a
torch.compile'd function (Inductor's kernel: C++ on the CPU, Triton on CUDA), on CUDA a Triton
kernel called eagerly, and the distributed forms over a world of one rank (the functional
collectives, DTensor, FSDP2's operator) with the process group they need for a run.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator

import torch


@functools.cache
def compiled_copy() -> Callable[[torch.Tensor, torch.Tensor], None]:
    """out <- src through a compiled function (`src * 1.0`: one generated kernel, NaN kept)."""
    scaled = torch.compile(lambda src: src * 1.0, dynamic=True)

    def copy(out: torch.Tensor, src: torch.Tensor) -> None:
        out.copy_(scaled(src))

    return copy


@functools.cache
def triton_copy() -> Callable[[torch.Tensor, torch.Tensor], None]:
    """out <- src through a Triton kernel, launched eagerly on the current stream (CUDA only)."""
    import triton
    import triton.language as tl

    @triton.jit
    def copy_kernel(src_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        tl.store(out_ptr + offsets, tl.load(src_ptr + offsets, mask=mask), mask=mask)

    def copy(out: torch.Tensor, src: torch.Tensor) -> None:
        n = src.numel()
        copy_kernel[(triton.cdiv(n, 1024),)](src, out, n, BLOCK=1024)

    return copy


# -- the distributed forms: a world of one rank ----------------------------------------------------
# A copy written as a collective runs on a process group of one rank, where an all-reduce or an
# all-gather hands back its input: the program's copy, through the functional collectives, DTensor
# and FSDP2's own operators. Their modules are imported at the first such copy, which in a fresh
# process is inside the first perturbed run: patch mode has started by then, as it has when a
# user's test imports FSDP2 inside its body.
DISTRIBUTED_FORMS = ("collective", "dtensor", "fsdp2")


@contextlib.contextmanager
def world_of_one(forms: set[str], *, cuda: bool) -> Iterator[None]:
    """A default process group of one rank (gloo on the CPU, NCCL on CUDA) for a run whose copies
    use `forms`, made for the run and destroyed after it; one already there (a benchmark holds one
    for all its runs) is used as it is, provided it has one rank."""
    import torch.distributed as dist

    if not forms & set(DISTRIBUTED_FORMS):
        yield
        return
    backend = "nccl" if cuda else "gloo"
    if dist.is_initialized():
        ranks, held = dist.get_world_size(), dist.get_backend()
        if ranks != 1 or held != backend:
            raise RuntimeError(
                f"a generated program's collectives need a {backend} world of one rank, not {held} of {ranks}"
            )
        yield
        return
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        if cuda:  # the group's last work done before it goes (the run may have ended in an error)
            torch.cuda.synchronize()
        _mesh.cache_clear()  # its groups are the destroyed world's
        dist.destroy_process_group()


@functools.cache
def _mesh(device_type: str):
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device_type, (1,))


@functools.cache
def collective_copy() -> Callable[[torch.Tensor, torch.Tensor], None]:
    """out <- src through a functional all-reduce and all-gather over the world of one (one rank's
    sum, one rank's shard: the input itself), each waited for when the next reads its result."""
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    # all_gather_single where it exists (all_gather_tensor warns there that it is deprecated)
    all_gather = getattr(funcol, "all_gather_single", None) or funcol.all_gather_tensor

    def copy(out: torch.Tensor, src: torch.Tensor) -> None:
        out.copy_(all_gather(funcol.all_reduce(src, "sum", dist.group.WORLD), 0, dist.group.WORLD))

    return copy


@functools.cache
def dtensor_copy() -> Callable[[torch.Tensor, torch.Tensor], None]:
    """out <- src as the local shard of a DTensor over a mesh of one, made whole by full_tensor().
    On a mesh of one rank DTensor hands the local tensor back without a collective: what this
    form covers is DTensor itself (its import under patch mode, its dispatch), the collectives
    being collective_copy's."""
    from torch.distributed.tensor import DTensor, Shard

    def copy(out: torch.Tensor, src: torch.Tensor) -> None:
        mesh = _mesh(src.device.type)
        out.copy_(DTensor.from_local(src, mesh, [Shard(0)], run_check=False).full_tensor())

    return copy


@functools.cache
def fsdp2_copy() -> Callable[[torch.Tensor, torch.Tensor], None]:
    """out <- src through FSDP2's own operator for copying an all-gather's output into the
    unsharded parameters (fsdp::split_with_sizes_copy, registered when FSDP2 is imported)."""
    import torch.distributed.fsdp  # noqa: F401  (registers torch.ops.fsdp)

    def copy(out: torch.Tensor, src: torch.Tensor) -> None:
        torch.ops.fsdp.split_with_sizes_copy(src, [src.numel()], dim=0, out=[out])

    return copy
