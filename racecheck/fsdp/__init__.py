"""FSDP/HSDP written only against racecheck.device: sharded parameter groups, all-gather before use,
reduce-scatter (and HSDP all-reduce) after backward, each on its own stream."""

from racecheck.fsdp.api import FSDPModule, fully_shard
from racecheck.fsdp.main_grad import MainGradPolicy
from racecheck.fsdp.mesh import Mesh, MeshConfig

__all__ = ["FSDPModule", "MainGradPolicy", "Mesh", "MeshConfig", "fully_shard"]
