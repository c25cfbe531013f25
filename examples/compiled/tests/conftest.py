"""Fixtures of the compiled example: how the arm orders its side streams (SIDE_STREAM_ORDERING),
fresh inputs for every repetition of a test, the one-rank process group FSDP2 needs, and an empty
caching allocator before each test.

The suite needs CUDA (its kernels are Triton's): each test module skips without it.
"""

import itertools
import os

import pytest

ORDERINGS = ("fixed", "hold", "drop_early", "no_wait")
_draws = itertools.count(1)


@pytest.fixture(scope="session")
def ordering():
    value = os.environ.get("SIDE_STREAM_ORDERING", "fixed")
    if value not in ORDERINGS:
        raise pytest.UsageError(f"SIDE_STREAM_ORDERING={value!r}: expected one of {', '.join(ORDERINGS)}")
    return value


@pytest.fixture
def generator():
    """A generator seeded anew for every test run: a stale block left by an earlier repetition
    never holds the values this one expects."""
    import torch

    return torch.Generator(device="cuda").manual_seed(next(_draws))


@pytest.fixture(scope="session")
def mesh():
    """A one-rank device mesh over NCCL (torchrun's environment gives more ranks)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    else:
        dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    yield init_device_mesh("cuda", (dist.get_world_size(),))
    dist.destroy_process_group()


@pytest.fixture(autouse=True)
def fresh_allocator():
    import torch

    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    yield


def pytest_report_header(config):
    return f"compiled example: SIDE_STREAM_ORDERING={os.environ.get('SIDE_STREAM_ORDERING', 'fixed')}"
