"""FSDP/HSDP written only against racecheck.device: sharded parameter groups, all-gather before use
(with prefetch), reshard after forward, reduce-scatter (and HSDP all-reduce) after backward, each on
its own stream; gradient accumulation, mixed precision, clipping, state dicts, meta-device init.

Modules, one responsibility each: mesh (who holds what), config (per-group options), flat_param
(the flat layout), param_group (unshard/reshard), reduce (gradient reduction and clipping), main_grad (the
gradient buffer's lifetime policies), autograd (how groups plug into autograd), schedule (prefetch
and end of backward), streams, state_dict, parity (the reference workload), api.
"""

from racecheck.fsdp.api import FSDPModule, fully_shard
from racecheck.fsdp.config import MixedPrecisionPolicy
from racecheck.fsdp.main_grad import MainGradPolicy
from racecheck.fsdp.mesh import Mesh, MeshConfig

__all__ = ["FSDPModule", "MainGradPolicy", "Mesh", "MeshConfig", "MixedPrecisionPolicy", "fully_shard"]
