"""The HSDP mesh as a value: how many ranks shard a parameter and how many replicas there are.

It has no torch in it, so that the command line can parse `--mesh` and name the mesh a run uses
without importing torch; racecheck.fsdp.mesh builds the communicators for it. This dataclass is
the one owner of the `SHARDxREPLICATE` spelling and of the default layout for a world size; the
runner reads the spelling once (racecheck.runner.options.read_mesh) and passes the value on.

A run passes the mesh to its test processes in the environment (`env()`): its two axes as plain
integers, RACECHECK_MESH_SHARD and RACECHECK_MESH_REPLICATE, from which racecheck's own suites
rebuild it (`from_env`, by the constructor) and which a project's suite, which does not import
racecheck, reads as they are; and RACECHECK_MESH in the spelling, for people and logs.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

from racecheck.protocol.names import MESH_REPLICATE_VAR as REPLICATE_ENV
from racecheck.protocol.names import MESH_SHARD_VAR as SHARD_ENV
from racecheck.protocol.names import MESH_VAR as MESH_ENV


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """How many ranks shard a parameter (`shard`) and how many replicas exist (`replicate`)."""

    shard: int
    replicate: int = 1

    def __post_init__(self) -> None:
        for axis in ("shard", "replicate"):
            size = getattr(self, axis)
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise ValueError(f"mesh axis {axis!r} must be a positive int, got {size!r}")

    @classmethod
    def parse(cls, spec: str) -> MeshConfig:
        """`SHARDxREPLICATE`, e.g. `2x2`; ValueError for anything else."""
        shard, _, replicate = spec.strip().lower().partition("x")
        if not (shard.isdigit() and replicate.isdigit() and int(shard) > 0 and int(replicate) > 0):
            raise ValueError(f"{spec!r} is not of the form SHARDxREPLICATE with positive integers, e.g. 2x2")
        return cls(shard=int(shard), replicate=int(replicate))

    @classmethod
    def for_world(cls, world_size: int) -> MeshConfig:
        """The default HSDP layout of a world: 2 x (world/2) when the world is even and larger
        than 2 (2-way shard x replicate), else every rank a shard."""
        if world_size > 2 and world_size % 2 == 0:
            return cls(shard=2, replicate=world_size // 2)
        return cls(shard=world_size, replicate=1)

    @classmethod
    def from_env(cls, world_size: int, *, environ: Mapping[str, str] | None = None) -> MeshConfig:
        """The mesh of a test process: the two axes `racecheck run --mesh` sets (RACECHECK_MESH_SHARD,
        RACECHECK_MESH_REPLICATE), else the default layout of `world_size`; ValueError naming the
        variable for an axis that is not a positive integer, for RACECHECK_MESH set without its
        axes, or for a mesh that does not cover the world."""
        env = os.environ if environ is None else environ
        axes = {name: env.get(name, "") for name in (SHARD_ENV, REPLICATE_ENV)}
        if not any(axes.values()):
            if env.get(MESH_ENV):
                raise ValueError(f"{MESH_ENV} is set without {SHARD_ENV} and {REPLICATE_ENV}, which carry the mesh")
            return cls.for_world(world_size)
        for name, value in axes.items():
            if not (value.isdigit() and int(value) > 0):
                raise ValueError(f"{name}={value!r} is not a positive integer")
        mesh = cls(shard=int(axes[SHARD_ENV]), replicate=int(axes[REPLICATE_ENV]))
        if mesh.world_size != world_size:
            raise ValueError(f"{MESH_ENV}={str(mesh)!r} does not cover a world of {world_size}")
        return mesh

    def env(self) -> dict[str, str]:
        """The variables that carry this mesh to a run's test processes (module docstring)."""
        return {MESH_ENV: str(self), SHARD_ENV: str(self.shard), REPLICATE_ENV: str(self.replicate)}

    def __str__(self) -> str:
        return f"{self.shard}x{self.replicate}"

    @property
    def world_size(self) -> int:
        return self.shard * self.replicate

    @property
    def is_hybrid(self) -> bool:
        return self.replicate > 1

    def shard_groups(self) -> list[list[int]]:
        """Rank lists along the shard axis (one per replica)."""
        return [[r * self.shard + s for s in range(self.shard)] for r in range(self.replicate)]

    def replicate_groups(self) -> list[list[int]]:
        """Rank lists along the replicate axis (one per shard index)."""
        return [[r * self.shard + s for r in range(self.replicate)] for s in range(self.shard)]
