"""Fixtures of the megatron-fsdp example: the process world, the HSDP mesh, a fresh allocator per
test, and the check of the `fixed` arm's switch (MFSDP_LAZY_MAIN_GRAD=1: test_hsdp.py applies the fix).

The suite runs as one process on one GPU (plain pytest) or as one process per GPU under torchrun;
it needs CUDA and skips without it (test_hsdp.py says so at collection).
"""

import os

import pytest

LAZY_MAIN_GRAD_ENV = "MFSDP_LAZY_MAIN_GRAD"


def _lazy_main_grad_requested() -> bool:
    value = os.environ.get(LAZY_MAIN_GRAD_ENV, "0")
    if value not in ("0", "1"):
        raise pytest.UsageError(f"{LAZY_MAIN_GRAD_ENV}={value!r}: expected 0 (as released) or 1 (fixed)")
    return value == "1"


def pytest_configure(config):
    # A bad value is a usage error before any test runs; the fix itself is applied by the test
    # that builds the model (test_hsdp.py), where megatron-fsdp is first imported.
    _lazy_main_grad_requested()


def pytest_report_header(config):
    arm = "lazy main_grad (fixed)" if _lazy_main_grad_requested() else "as released (asis)"
    return f"megatron-fsdp example: {arm}"


def _mesh_shape(world_size: int) -> tuple[int, int]:
    """(replicate, shard) for the world: the run's mesh when it gives one (`racecheck run --mesh`
    sets RACECHECK_MESH_SHARD and RACECHECK_MESH_REPLICATE), else 2-way shard x world/2 replicas
    for an even world above 2, else every rank a shard."""
    axes = [os.environ.get(f"RACECHECK_MESH_{axis}") for axis in ("REPLICATE", "SHARD")]
    if any(axes):
        shape = tuple(int(a or 1) for a in axes)  # racecheck wrote them as plain integers
        if shape[0] * shape[1] != world_size:
            raise pytest.UsageError(f"the run's mesh {shape[1]}x{shape[0]} does not cover a world of {world_size}")
        return shape
    if world_size > 2 and world_size % 2 == 0:
        return world_size // 2, 2
    return 1, world_size


@pytest.fixture(scope="session")
def mesh():
    """The HSDP device mesh (replicate x shard), over NCCL; one per session."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size > 1:
        dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))  # torchrun's env
    else:
        # One process, no launcher: a one-rank NCCL group, so every collective is still a kernel
        # on the stream it is issued on.
        dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    yield init_device_mesh("cuda", _mesh_shape(world_size), mesh_dim_names=("replicate", "shard"))
    dist.destroy_process_group()


@pytest.fixture(autouse=True)
def fresh_allocator():
    """Every test starts with an empty caching allocator, as in a fresh process: where a block
    lands must not depend on which tests ran before in the same session."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    yield
