"""racecheck.fsdp's configuration is validated where it is built, and the flat layout pads and
slices groups so that every rank's shard is equal and every parameter lands in exactly one place."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from racecheck.fsdp import Mesh, MeshConfig, MixedPrecisionPolicy, fully_shard
from racecheck.fsdp.config import GroupOptions
from racecheck.fsdp.flat_param import ALIGN_NUMEL, FlatLayout


@pytest.mark.parametrize("kwargs", [dict(shard=0), dict(shard=2, replicate=0), dict(shard=1.5), dict(shard=True)])
def test_mesh_config_rejects_non_positive_or_non_int_axes(kwargs):
    with pytest.raises(ValueError, match="mesh axis"):
        MeshConfig(**kwargs)


def test_mesh_config_rank_layout_is_replicate_major():
    config = MeshConfig(shard=2, replicate=3)
    assert config.world_size == 6 and config.is_hybrid
    assert config.shard_groups() == [[0, 1], [2, 3], [4, 5]]
    assert config.replicate_groups() == [[0, 2, 4], [1, 3, 5]]


def test_mesh_must_match_the_process_world(rt):
    with pytest.raises(ValueError, match="needs 4 ranks"):
        Mesh(MeshConfig(shard=2, replicate=2), runtime=rt)


def test_group_options_validate_policy_and_flags():
    with pytest.raises(ValueError, match="unknown main_grad_policy"):
        GroupOptions(main_grad_policy="lazy")
    with pytest.raises(TypeError, match="prefetch"):
        GroupOptions(prefetch="yes")
    with pytest.raises(ValueError, match="floating dtype"):
        MixedPrecisionPolicy(param_dtype=torch.int32)
    assert GroupOptions(main_grad_policy="record_stream").main_grad_policy.value == "record_stream"


def test_fully_shard_twice_and_bad_mesh_are_user_errors(rt):
    mesh = Mesh(MeshConfig(shard=1), runtime=rt)
    layer = fully_shard(nn.Linear(3, 3), mesh=mesh, runtime=rt)
    with pytest.raises(ValueError, match="already applied"):
        fully_shard(layer, mesh=mesh, runtime=rt)
    with pytest.raises(TypeError, match="mesh must be"):
        fully_shard(nn.Linear(3, 3), mesh=MeshConfig(shard=1), runtime=rt)


def test_tied_parameters_are_refused(rt):
    model = nn.Sequential(nn.Linear(4, 4, bias=False), nn.Linear(4, 4, bias=False))
    model[1].weight = model[0].weight
    with pytest.raises(ValueError, match="tied"):
        fully_shard(model, mesh=Mesh(MeshConfig(shard=1), runtime=rt), runtime=rt)


@pytest.mark.parametrize("shard_count", [1, 2, 3, 4])
def test_flat_layout_pads_aligns_and_covers_every_element_once(shard_count):
    model = nn.Sequential(nn.Linear(7, 5), nn.LayerNorm(5), nn.Linear(5, 3))
    layout = FlatLayout.of(model, shard_count=shard_count)
    assert all(i.offset % ALIGN_NUMEL == 0 for i in layout.infos)
    assert layout.padded_numel % (shard_count * ALIGN_NUMEL) == 0
    assert layout.padded_numel >= layout.numel == layout.infos[-1].offset + layout.infos[-1].numel
    covered = {i.fqn: 0 for i in layout.infos}
    for k in range(shard_count):
        start, end = layout.shard_range(k)
        assert end - start == layout.shard_numel
        for info, lo, hi in layout.pieces(k):
            assert 0 <= lo <= hi <= info.numel
            covered[info.fqn] += hi - lo
    assert covered == {i.fqn: i.numel for i in layout.infos}


def test_flat_layout_refuses_mixed_dtypes():
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2).double())
    with pytest.raises(ValueError, match="one parameter dtype"):
        FlatLayout.of(model, shard_count=1)


def test_state_dict_keys_are_the_unwrapped_names_and_strict_loading_checks_them(rt):
    torch.manual_seed(0)
    reference = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    mesh = Mesh(MeshConfig(shard=1), runtime=rt)
    fully_shard(model[0], mesh=mesh, runtime=rt)
    fully_shard(model, mesh=mesh, runtime=rt)
    full = model.full_state_dict()
    expected = reference.state_dict()
    assert set(full) == set(expected)
    for name, value in expected.items():
        assert torch.equal(full[name], value), name
    with pytest.raises(KeyError, match="missing"):
        model.load_full_state_dict({k: v for k, v in full.items() if k != "0.bias"})
    sharded = model.sharded_state_dict()
    model.load_sharded_state_dict(sharded)
    assert all(torch.equal(a, b) for a, b in zip(model.full_state_dict().values(), full.values(), strict=True))
