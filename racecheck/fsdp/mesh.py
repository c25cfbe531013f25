"""The device mesh: one validated dataclass is the source of truth for the layout of ranks.

A 1-D mesh is FSDP (every rank holds a shard); a 2-D mesh is HSDP: the `shard` axis shards
parameters, the `replicate` axis holds identical replicas whose gradients are all-reduced.
Ranks are laid out replicate-major: rank = replicate_index * shard + shard_index.
"""

from __future__ import annotations

import torch.distributed as dist

from racecheck.device import CommGroup, Runtime, get_runtime
from racecheck.protocol.mesh import MeshConfig  # the layout; re-exported here


class Mesh:
    """This rank's view of a MeshConfig: its coordinates and a communicator per axis.

    Building it is collective: every rank must build the same meshes in the same order."""

    def __init__(self, config: MeshConfig, *, runtime: Runtime | None = None) -> None:
        self.config = config
        self.runtime = runtime or get_runtime()
        world = dist.get_world_size() if dist.is_initialized() else 1
        rank = dist.get_rank() if dist.is_initialized() else 0
        if world != config.world_size:
            raise ValueError(
                f"mesh {config.shard}x{config.replicate} needs {config.world_size} ranks, the process group has {world}"
            )
        self.rank = rank
        self.shard_index = rank % config.shard
        self.replicate_index = rank // config.shard
        self.shard_group = self._axis_group(config.shard_groups())
        self.replicate_group = self._axis_group(config.replicate_groups())

    def _axis_group(self, rank_lists: list[list[int]]) -> CommGroup:
        mine = None
        for ranks in rank_lists:  # every rank creates every group, in the same order
            group = self.runtime.new_group(ranks)
            if self.rank in ranks:
                mine = group
        assert mine is not None
        return mine

    def __repr__(self) -> str:
        return f"Mesh(shard={self.config.shard}, replicate={self.config.replicate}, rank={self.rank})"
