"""Fixtures of the plain-torch example: which version of the patterns runs (PLAIN_TORCH_FIXED),
the process group, and a fresh allocator per test. The tests need CUDA and skip without it."""

import os

import pytest

FIXED_ENV = "PLAIN_TORCH_FIXED"


@pytest.fixture(scope="session")
def fixed() -> bool:
    """True for the correct version of every pattern, False for the one with the mistake."""
    value = os.environ.get(FIXED_ENV, "1")
    if value not in ("0", "1"):
        raise pytest.UsageError(f"{FIXED_ENV}={value!r}: expected 0 (the race) or 1 (correct)")
    return value == "1"


def pytest_report_header(config):
    return f"plain-torch patterns: {FIXED_ENV}={os.environ.get(FIXED_ENV, '1')}"


@pytest.fixture(scope="session")
def group():
    """The world's process group over NCCL (torchrun's environment, else one rank)."""
    import torch
    import torch.distributed as dist

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    else:
        # One process, no launcher: a one-rank NCCL group, so every collective is still a kernel
        # on the stream it is issued on.
        dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    _warm_up()
    yield dist.group.WORLD
    dist.destroy_process_group()


def _warm_up() -> None:
    """A process's one-time work before the first test (cuBLAS handles and workspaces of the main
    and the autograd thread, NCCL's first collective), so that every test starts alike."""
    import torch
    import torch.distributed as dist

    w = torch.randn(256, 256, device="cuda", requires_grad=True)
    (torch.randn(256, 256, device="cuda") @ w).sum().backward()
    dist.all_reduce(w.grad)
    torch.cuda.synchronize()


@pytest.fixture(autouse=True)
def fresh_allocator():
    """Every test starts with an empty caching allocator, as in a fresh process."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    yield
