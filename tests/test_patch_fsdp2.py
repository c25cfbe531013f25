"""Patch mode on PyTorch's FSDP2 itself, on the CPU: a two-rank world of the fake process group
(one process; its collectives do nothing), so that FSDP2 issues the all-gathers and
reduce-scatters it skips on a one-rank world, and the recording twin of the CUDA actions says
what patch mode did at each. What a GPU adds is in bench/foreign_code.py (examples/fsdp2).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from racecheck.perturb.patch import PatchMode
from racecheck.perturb.profiles import parse_profile
from racecheck.perturb.recording import RecordingActions


@pytest.fixture(scope="module")
def mesh():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    yield init_device_mesh("cpu", (2,))
    dist.destroy_process_group()


def sharded_model(mesh):
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def test_fsdp2s_own_all_gathers_and_reduce_scatters_pass_the_collective_points(mesh):
    model = sharded_model(mesh)
    actions = RecordingActions()
    spec = "sleep@before_all_gather:1ms,sleep@before_reduce_scatter:2ms,sleep@after_all_gather:3ms"
    patch = PatchMode(parse_profile(spec), actions=actions)
    with patch:
        model(torch.randn(4, 16)).sum().backward()
    # forward and backward all-gather both layers (resharded after forward); backward
    # reduce-scatters each layer's gradients
    assert patch.calls == {"all_gather": 4, "reduce_scatter": 2}
    assert sorted(d for d, _ in actions.launches) == [0.001] * 4 + [0.002] * 2
    assert sum(seconds == 0.003 for _, seconds in actions.delays) == 4  # after each all-gather


def test_the_systematic_schedule_enumerates_fsdp2s_collectives_on_both_sides(mesh):
    model = sharded_model(mesh)
    recorder = PatchMode(parse_profile("systematic"), actions=RecordingActions())
    with recorder:
        model(torch.randn(4, 16)).sum().backward()
    kinds = {key.split("@")[0] for key in recorder.handoffs}
    assert {"before_all_gather", "after_all_gather", "before_reduce_scatter", "after_reduce_scatter"} <= kinds
