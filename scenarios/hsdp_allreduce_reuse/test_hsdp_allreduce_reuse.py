"""HSDP all-reduce reuse: cross-layer gradient aliasing under a slow all-reduce.

HSDP reduce-scatters each group's gradient over the shard axis into a buffer B allocated on the
reduce-scatter stream, then all-reduces B over the replicate axis on its own stream, so the
all-reduce overlaps the next group's reduce-scatter. In the `drop_after_all_reduce` arm the host
releases B as soon as the all-reduce is enqueued: B's block goes back to the reduce-scatter pool,
the next group's reduce-scatter output is allocated the same block and written while the all-reduce
(held back) has not read it yet, so one layer's sharded gradient becomes another's. The test trains
an MLP whose layers are equal-sized groups and compares losses and parameters with a
single-process reference.
"""

import pytest
import torch.distributed as dist

from racecheck.fsdp import Mesh, MeshConfig
from racecheck.scenario_kit.mlp_parity import train_against_reference

HOLD = {"hold_until_wait": True, "drop_after_all_reduce": False}


@pytest.fixture(scope="module")
def mesh(world):
    # Always hybrid: 2 replicas (the all-reduce axis) x world/2 shards; 2x2 on 4 ranks, 1x2 on 2.
    size = dist.get_world_size()
    if size < 2 or size % 2:
        pytest.fail(f"HSDP needs an even world of at least 2 ranks, got {size}", pytrace=False)
    return Mesh(MeshConfig(shard=size // 2, replicate=2), runtime=world)


@pytest.mark.parametrize("num_microbatches", [1, 2])
def test_hsdp_training_matches_reference(num_microbatches, mesh, runtime, racecheck_arm, racecheck_seed):
    train_against_reference(
        mesh=mesh,
        runtime=runtime,
        shard_options={"hold_reduce_output": HOLD[racecheck_arm or "hold_until_wait"]},
        num_microbatches=num_microbatches,
        model_seed=4321,
        data_seed=racecheck_seed,
    )
