"""Fixtures of the FSDP2 example: the process world and its device mesh (FSDP on one GPU, HSDP
on an even number above 2), the precision the arm trains in (FSDP2_PRECISION: bf16 parameters
with fp32 reduction, or fp32 throughout), and a fresh allocator per test.

The suite runs as one process on one GPU (plain pytest) or one process per GPU under torchrun; it
needs CUDA and skips without it (test_fully_shard.py says so at collection).
"""

import os

import pytest


def _mesh_shape(world_size: int) -> tuple[int, ...]:
    """(replicate, shard) for HSDP when the run gives a mesh (`racecheck run --mesh` sets
    RACECHECK_MESH_SHARD and RACECHECK_MESH_REPLICATE) or the world is even and above 2 (2-way
    shard); else (world,): plain FSDP."""
    axes = [os.environ.get(f"RACECHECK_MESH_{axis}") for axis in ("REPLICATE", "SHARD")]
    if any(axes):
        shape = tuple(int(a or 1) for a in axes)  # racecheck wrote them as plain integers
        if shape[0] * shape[1] != world_size:
            raise pytest.UsageError(f"the run's mesh {shape[1]}x{shape[0]} does not cover a world of {world_size}")
        return shape
    if world_size > 2 and world_size % 2 == 0:
        return world_size // 2, 2
    return (world_size,)


@pytest.fixture(scope="session")
def mesh():
    """The device mesh over NCCL; one per session."""
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
    shape = _mesh_shape(world_size)
    names = ("replicate", "shard") if len(shape) == 2 else ("shard",)
    yield init_device_mesh("cuda", shape, mesh_dim_names=names)
    dist.destroy_process_group()


PRECISION_ENV = "FSDP2_PRECISION"


@pytest.fixture(scope="session")
def param_dtype():
    """The dtype FSDP2 all-gathers parameters in and computes with (gradients reduce in fp32)."""
    import torch

    value = os.environ.get(PRECISION_ENV, "bf16")
    if value not in ("bf16", "fp32"):
        raise pytest.UsageError(f"{PRECISION_ENV}={value!r}: expected bf16 or fp32")
    return torch.bfloat16 if value == "bf16" else torch.float32


def pytest_report_header(config):
    return f"fsdp2 example: {PRECISION_ENV}={os.environ.get(PRECISION_ENV, 'bf16')}"


@pytest.fixture(autouse=True)
def fresh_allocator():
    """Every test starts with an empty caching allocator, as in a fresh process."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    yield
